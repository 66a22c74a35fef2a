"""Dataset loaders: generated data, IDX validation, downloads against a local HTTP server."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import os
import struct
import threading

import numpy as np
import pytest

from micrograd_c import datasets as ds


def idx_bytes(arr: np.ndarray) -> bytes:
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    return header + arr.astype(np.uint8).tobytes()


def write_mnist(d, n=12, gz=True, split="test"):
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, size=(n, 28, 28))
    labels = rng.randint(0, 10, size=n)
    names = ds.MNIST_FILES[split]
    for name, arr in zip(names, (images, labels)):
        data = idx_bytes(arr)
        if gz:
            (d / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (d / name).write_bytes(data)
    return images, labels


def test_moons_and_xor_are_seeded_and_labelled():
    X, y = ds.make_moons(100, 0.1, seed=1)
    X2, y2 = ds.make_moons(100, 0.1, seed=1)
    assert X.shape == (100, 2) and np.array_equal(X, X2) and set(np.unique(y)) == {-1.0, 1.0}
    assert not np.array_equal(X, ds.make_moons(100, 0.1, seed=2)[0])
    X, y = ds.make_xor(50)
    assert X.shape == (50, 2) and set(np.unique(y)) <= {-1.0, 1.0}
    with pytest.raises(ValueError):
        ds.make_moons(1)


@pytest.mark.parametrize("gz", [True, False])
def test_load_mnist_from_idx(tmp_path, gz):
    images, labels = write_mnist(tmp_path, gz=gz)
    X, y = ds.load_mnist(str(tmp_path), "test")
    assert X.shape == (12, 784) and X.max() <= 1.0
    assert np.array_equal(X[3], images[3].reshape(784) / 255.0)
    assert np.array_equal(y, labels)
    X32, y32 = ds.load_mnist(str(tmp_path), "test", dtype=np.float32)
    assert X32.dtype == np.float32 and X32.flags.c_contiguous
    assert np.array_equal(X32, X.astype(np.float32)) and np.array_equal(y32, y)
    for same in ("float32", np.dtype(np.float32)):
        assert ds.load_mnist(str(tmp_path), "test", dtype=same)[0].dtype == np.float32
    assert ds.load_mnist(str(tmp_path), "test", dtype="float64")[0].dtype == np.float64
    for bad in (np.int32, "float16", "nonsense"):
        with pytest.raises(ValueError, match="dtype"):
            ds.load_mnist(str(tmp_path), "test", dtype=bad)


def test_real_mnist_test_set(mnist_dir):
    X, y = ds.load_mnist(mnist_dir, "test")
    assert X.shape == (10000, 784) and y.shape == (10000,)
    assert set(np.unique(y)) == set(range(10))


def test_idx_validation(tmp_path):
    write_mnist(tmp_path, gz=False)
    img = tmp_path / "t10k-images-idx3-ubyte"
    good = img.read_bytes()
    img.write_bytes(good[:-5])  # truncated
    with pytest.raises(ds.DatasetError, match="header says"):
        ds.load_mnist(str(tmp_path))
    img.write_bytes(b"\x00\x00\x0d\x03" + good[4:])  # float type
    with pytest.raises(ds.DatasetError, match="not an unsigned-byte IDX"):
        ds.load_mnist(str(tmp_path))
    img.write_bytes(idx_bytes(np.zeros((12, 28, 27))))  # wrong image size
    with pytest.raises(ds.DatasetError, match="expected \\(n, 28, 28\\)"):
        ds.load_mnist(str(tmp_path))
    img.write_bytes(idx_bytes(np.zeros((11, 28, 28))))  # counts disagree
    with pytest.raises(ds.DatasetError, match="11 images but 12 labels"):
        ds.load_mnist(str(tmp_path))
    img.write_bytes(idx_bytes(np.zeros((12, 28, 28))))
    lab = tmp_path / "t10k-labels-idx1-ubyte"
    good_labels = lab.read_bytes()
    lab.write_bytes(idx_bytes(np.zeros((12, 1))))  # labels of two dimensions
    with pytest.raises(ds.DatasetError, match=r"labels have shape \(12, 1\), expected \(n,\)"):
        ds.load_mnist(str(tmp_path))
    img.write_bytes(good)
    lab.write_bytes(good_labels)
    corrupt = bytearray(gzip.compress(good))
    corrupt[20:30] = (
        b"\xff" * 10
    )  # a valid gzip header over a broken deflate stream (found by fuzzing)
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(bytes(corrupt))
    with pytest.raises(ds.DatasetError, match="cannot read|shape"):  # garbage from the header on
        ds.load_mnist(str(tmp_path))
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8bgarbage")  # corrupt gzip wins
    with pytest.raises(ds.DatasetError, match="cannot read"):
        ds.load_mnist(str(tmp_path))
    with pytest.raises(ds.DatasetError, match="found"):
        ds.load_mnist(str(tmp_path / "nowhere"))


# ---- downloads ---------------------------------------------------------------------------------


class Server:
    """A local HTTP server with knobs: Range support, a corrupt file, a connection that drops."""

    def __init__(self, files):
        self.files = dict(files)
        self.drop_once = set()  # names whose first response stops halfway
        self.ranges = True
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                name = self.path.rsplit("/", 1)[-1]
                outer.requests.append((name, self.headers.get("Range")))
                if name not in outer.files:
                    self.send_error(404)
                    return
                body = outer.files[name]
                start = 0
                rng = self.headers.get("Range")
                if rng and outer.ranges:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if name in outer.drop_once:
                    outer.drop_once.discard(name)
                    self.wfile.write(body[start : start + (len(body) - start) // 2])
                    self.wfile.flush()
                    self.connection.close()  # the rest never comes
                    return
                self.wfile.write(body[start:])

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/mnist/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def small_mnist_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_mnist(src, n=30)
    write_mnist(src, n=60, split="train")
    files = {p.name: p.read_bytes() for p in src.iterdir()}
    return files, {name: hashlib.sha256(b).hexdigest() for name, b in files.items()}


def test_download_verifies_and_loads(tmp_path):
    files, sums = small_mnist_files(tmp_path)
    with Server(files) as srv:
        d = ds.download_mnist(str(tmp_path / "dl"), mirrors=[srv.url], sha256=sums, timeout=10)
    X, y = ds.load_mnist(d, "train")
    assert X.shape == (60, 784)
    assert not any(f.endswith(".part") for f in os.listdir(d))
    # a second call finds verified files and fetches nothing
    with Server(files) as srv:
        ds.download_mnist(d, mirrors=[srv.url], sha256=sums, timeout=10)
        assert srv.requests == []


def test_download_resumes_after_a_dropped_connection(tmp_path):
    files, sums = small_mnist_files(tmp_path)
    name = "t10k-images-idx3-ubyte.gz"
    with Server(files) as srv:
        srv.drop_once.add(name)
        path = ds.download(
            name, str(tmp_path / "dl"), sums[name], mirrors=[srv.url], retries=3, timeout=10
        )
        ranges = [r for n, r in srv.requests if n == name]
    assert open(path, "rb").read() == files[name]
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")  # resumed


def test_download_restarts_when_the_server_ignores_ranges(tmp_path):
    files, sums = small_mnist_files(tmp_path)
    name = "t10k-labels-idx1-ubyte.gz"
    dest = tmp_path / "dl"
    dest.mkdir()
    (dest / (name + ".part")).write_bytes(files[name][:7])  # a partial file from an earlier run
    with Server(files) as srv:
        srv.ranges = False
        path = ds.download(name, str(dest), sums[name], mirrors=[srv.url], timeout=10)
    assert open(path, "rb").read() == files[name]


def test_download_rejects_a_corrupt_file_and_tries_the_next_mirror(tmp_path):
    files, sums = small_mnist_files(tmp_path)
    name = "t10k-labels-idx1-ubyte.gz"
    bad = dict(files)
    bad[name] = files[name][:-3] + b"xyz"
    with Server(bad) as corrupt, Server(files) as good:
        path = ds.download(
            name, str(tmp_path / "dl"), sums[name], mirrors=[corrupt.url, good.url], timeout=10
        )
    assert open(path, "rb").read() == files[name]
    with Server(bad) as corrupt:
        with pytest.raises(ds.DatasetError, match="SHA-256"):
            ds.download(name, str(tmp_path / "dl2"), sums[name], mirrors=[corrupt.url], timeout=10)
    assert not os.path.exists(tmp_path / "dl2" / name)  # nothing unverified is left in place


def test_download_reports_unreachable_mirrors(tmp_path):
    with pytest.raises(ds.DatasetError, match="could not download"):
        ds.download(
            "x.gz", str(tmp_path), "0" * 64, mirrors=["http://127.0.0.1:9/"], retries=1, timeout=2
        )


# ---- issue #10 item 16: the header bounds everything read after it -----------------------------


def test_a_gzip_bomb_costs_no_more_than_its_header_declares(tmp_path):
    import tracemalloc

    header = struct.pack(">HBB", 0, 0x08, 3) + struct.pack(
        ">III", 10, 28, 28
    )  # 7,840 bytes declared
    bomb = tmp_path / "bomb.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as f:
        f.write(header)
        block = b"\0" * (1 << 20)
        for _ in range(200):  # 200 MB of zeros after the declared data, in a ~200 KB file
            f.write(block)
    assert bomb.stat().st_size < 1_000_000
    tracemalloc.start()
    try:
        with pytest.raises(ds.DatasetError, match="header says 7840 bytes"):
            ds.read_idx(str(bomb))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8_000_000  # the old reader decompressed all 200 MB first


@pytest.mark.parametrize(
    "dims, message",
    [
        ((0, 28, 28), "holds no data"),
        ((5, 0), "holds no data"),
        ((2**32 - 1,) * 4, "more than the"),  # the product wraps a 64-bit integer
        ((2**16, 2**16, 2**16, 2**16), "more than the"),  # exactly 2**64: wrapped to 0 before
        ((60000, 28, 28, 28), "more than the"),
    ],
)
def test_absurd_or_empty_shapes_are_refused(tmp_path, dims, message):
    p = tmp_path / "x-idx"
    p.write_bytes(
        struct.pack(">HBB", 0, 0x08, len(dims))
        + struct.pack(">" + "I" * len(dims), *dims)
        + b"\1" * 16
    )
    with pytest.raises(ds.DatasetError, match=message):
        ds.read_idx(str(p))
    with gzip.open(tmp_path / "x-idx.gz", "wb") as f:
        f.write(p.read_bytes())
    with pytest.raises(ds.DatasetError, match=message):
        ds.read_idx(str(tmp_path / "x-idx.gz"))


def test_trailing_data_and_short_bodies_are_refused_in_gzip_too(tmp_path):
    arr = np.arange(12).reshape(3, 4)
    for body, what in (
        (idx_bytes(arr) + b"\0", "more than 12"),
        (idx_bytes(arr)[:-1], "file has 11"),
    ):
        (tmp_path / "a.gz").write_bytes(gzip.compress(body))
        with pytest.raises(ds.DatasetError, match=what):
            ds.read_idx(str(tmp_path / "a.gz"))
    (tmp_path / "a.gz").write_bytes(gzip.compress(idx_bytes(arr)))
    assert np.array_equal(ds.read_idx(str(tmp_path / "a.gz")), arr)


def test_reader_on_a_directory_is_a_dataset_error(tmp_path):
    with pytest.raises(ds.DatasetError):
        ds.read_idx(str(tmp_path))


# ---- issue #11 item 3: a failed download says so once and leaves nothing behind ------------------


def test_failed_download_names_each_mirror_once_and_removes_what_it_created(tmp_path):
    dest = tmp_path / "cache" / "micrograd_c" / "mnist"
    with pytest.raises(ds.DatasetError) as e:
        ds.download_mnist(
            str(dest),
            mirrors=["http://127.0.0.1:9/m1/", "http://127.0.0.1:9/m2/"],
            retries=3,
            timeout=2,
        )
    msg = str(e.value)
    assert msg.count("http://127.0.0.1:9/m1/") == 1 and msg.count("http://127.0.0.1:9/m2/") == 1
    assert msg.count("(3 attempts)") == 2
    assert not (tmp_path / "cache").exists()


def test_mirrors_can_be_set_in_the_environment(tmp_path, monkeypatch):
    files, sums = small_mnist_files(tmp_path)
    with Server(files) as srv:
        monkeypatch.setenv("MICROGRAD_C_MNIST_MIRRORS", "http://127.0.0.1:9/ " + srv.url)
        assert ds.mnist_mirrors() == ("http://127.0.0.1:9/", srv.url)
        d = ds.download_mnist(str(tmp_path / "dl"), sha256=sums, retries=1, timeout=10)
    assert ds.load_mnist(d, "train")[0].shape == (60, 784)
