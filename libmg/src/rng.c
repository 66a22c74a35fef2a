/* The seeded generator: kernels.h's xoshiro256**, the one implementation libmg and generated code
 * share (frozen programs shuffle with it). */
#include "kernels.h"
#include "mg/rng.h"

#include <math.h>

void mg_rng_seed(mg_rng *rng, uint64_t seed) {
    if (!rng) return;
    mgk_rng r;
    mgk_rng_seed(&r, seed);
    for (int i = 0; i < 4; i++) rng->s[i] = r.s[i];
}

uint64_t mg_rng_next(mg_rng *rng) {
    if (!rng) return 0;
    mgk_rng r;
    for (int i = 0; i < 4; i++) r.s[i] = rng->s[i];
    uint64_t x = mgk_rng_next(&r);
    for (int i = 0; i < 4; i++) rng->s[i] = r.s[i];
    return x;
}

double mg_rng_uniform(mg_rng *rng, double lo, double hi) {
    if (!rng) return NAN;
    /* 53 bits -> [0, 1) exactly; one multiply and one add, both correctly rounded. */
    double u = (double)(mg_rng_next(rng) >> 11) * 0x1.0p-53;
    return lo + (hi - lo) * u;
}
