/**
 * @file rng.h
 * @brief A seeded pseudo-random generator, the same sequence on every platform.
 *
 * @defgroup rng Random numbers
 * @brief xoshiro256**, seeded through splitmix64: what neurons, layers and MLPs draw their
 * weights from (mg_mlp_new()), and the generator frozen programs shuffle samples with.
 * @{
 */
#ifndef MG_RNG_H
#define MG_RNG_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A generator's state; seed it with mg_rng_seed() before use. Copying it forks the sequence. */
typedef struct mg_rng {
    uint64_t s[4]; /**< Generator state. */
} mg_rng;

/**
 * @brief Seeds a generator. The same seed gives the same sequence on every platform.
 * @param[out] rng the generator to seed; NULL is a no-op
 * @param seed any 64-bit seed
 */
MG_API void mg_rng_seed(mg_rng *rng, uint64_t seed);

/**
 * @brief Next 64 random bits.
 * @param rng the generator
 * @return the bits; 0 for NULL.
 */
MG_API uint64_t mg_rng_next(mg_rng *rng);

/**
 * @brief A double uniform in [lo, hi), from 53 random bits (exact on every platform).
 * @param rng the generator
 * @param lo lower bound
 * @param hi upper bound
 * @return the number; NaN for NULL.
 */
MG_API double mg_rng_uniform(mg_rng *rng, double lo, double hi);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_RNG_H */
