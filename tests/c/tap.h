/* A minimal TAP producer for the C tests: one `ok`/`not ok` line per test function. */
#ifndef MG_TEST_TAP_H
#define MG_TEST_TAP_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static int tap__failed; /* failures inside the running test */
static int tap__count;
static int tap__bad;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("#   %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);                    \
            tap__failed++;                                                                         \
        }                                                                                          \
    } while (0)

/* |a - b| <= tol * max(1, |a|, |b|) */
#define CHECK_CLOSE(a, b, tol)                                                                     \
    do {                                                                                           \
        double ca_ = (a), cb_ = (b), m_ = fabs(ca_) > fabs(cb_) ? fabs(ca_) : fabs(cb_);           \
        if (!(fabs(ca_ - cb_) <= (tol) * (m_ > 1.0 ? m_ : 1.0))) {                                 \
            printf("#   %s:%d: %s = %.17g, expected %s = %.17g\n", __FILE__, __LINE__, #a, ca_,    \
                   #b, cb_);                                                                       \
            tap__failed++;                                                                         \
        }                                                                                          \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        tap__failed = 0;                                                                           \
        fn();                                                                                      \
        tap__count++;                                                                              \
        if (tap__failed) tap__bad++;                                                               \
        printf("%s %d - %s\n", tap__failed ? "not ok" : "ok", tap__count, #fn);                    \
        fflush(stdout);                                                                            \
    } while (0)

#define TAP_DONE()                                                                                 \
    do {                                                                                           \
        printf("1..%d\n", tap__count);                                                             \
        return tap__bad ? 1 : 0;                                                                   \
    } while (0)

#endif
