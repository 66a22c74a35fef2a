/* A failing allocator for the tests: it fails one chosen allocation and counts the blocks still
 * live, so a test can fail the k-th allocation of a workload and check that the call reported it,
 * that the graph is as it was, and that nothing leaked.
 *
 *     failing_alloc fa = {0};
 *     mg_allocator al = failing_allocator(&fa);
 *     mg_graph *g = mg_graph_new_with(&al);
 *     fa.fail_at = fa.count + k;   // fail the k-th allocation from now (0: never)
 *     ...
 *     mg_graph_free(g);
 *     CHECK(fa.live == 0);
 */
#ifndef MG_TEST_FAILING_ALLOC_H
#define MG_TEST_FAILING_ALLOC_H

#include <mg/common.h>

#include <stdlib.h>

typedef struct failing_alloc {
    long count;   /* allocations so far: malloc and realloc calls, the failed one included */
    long fail_at; /* the allocation to fail, counted as `count` is; 0: none */
    long live;    /* blocks allocated and not yet freed */
    int failed;   /* set once an allocation was failed */
} failing_alloc;

/* Counts the call; whether it is the one to fail. */
static inline int failing_alloc__fails(failing_alloc *f) {
    if (++f->count != f->fail_at) return 0;
    f->failed = 1;
    return 1;
}

static inline void *failing_alloc__malloc(size_t n, void *ctx) {
    failing_alloc *f = (failing_alloc *)ctx;
    if (failing_alloc__fails(f)) return NULL;
    void *p = malloc(n);
    if (p) f->live++;
    return p;
}

static inline void *failing_alloc__realloc(void *p, size_t n, void *ctx) {
    failing_alloc *f = (failing_alloc *)ctx;
    if (failing_alloc__fails(f)) return NULL;
    void *q = realloc(p, n);
    if (q && !p) f->live++;
    return q;
}

static inline void failing_alloc__free(void *p, void *ctx) {
    failing_alloc *f = (failing_alloc *)ctx;
    if (p) f->live--;
    free(p);
}

/* The allocator over `f`; `f` must outlive every graph or map that allocates through it. */
static inline mg_allocator failing_allocator(failing_alloc *f) {
    mg_allocator a = {failing_alloc__malloc, failing_alloc__realloc, failing_alloc__free, f};
    return a;
}

#endif /* MG_TEST_FAILING_ALLOC_H */
