/* Compiles the umbrella header as strict C11; the build fails on any warning. Also the ABI of
 * libmg.so.N (N = MG_TEST_SOVERSION, libmg/meson.build's soversion): callers allocate these
 * structs themselves (options, specs, stats, checkpoints), so a struct that changes size breaks
 * every program built against the older header (mg_tape_get_stats writing past a caller's
 * smaller struct). A size that changes fails the build here until the soversion is raised and
 * the new sizes are written under it. */
#include <mg/mg.h>

#ifndef MG_TEST_SOVERSION
#error "MG_TEST_SOVERSION: libmg's soversion, from tests/c/meson.build"
#endif

#if defined(__LP64__) /* sizes taken on x86-64 Linux; LP64 targets lay these structs out alike */
#if MG_TEST_SOVERSION == 1
#define MG_ABI(T, bytes)                                                                           \
    _Static_assert(sizeof(T) == (bytes), #T " changed size: raise the soversion")
MG_ABI(mg_allocator, 32);
MG_ABI(mg_graph_checkpoint, 8);
MG_ABI(mg_rng, 32);
MG_ABI(mg_tape_spec, 80);
MG_ABI(mg_tape_stats, 72);
MG_ABI(mg_fit_options, 56);
MG_ABI(mg_emit_options, 24);
#else
#error "a new soversion: write the sizes of its structs here"
#endif
#endif

int main(void) { return mg_op_name(MG_OP_ADD) == 0; }
