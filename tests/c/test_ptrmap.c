/* The pointer map of libmg/src/ptrmap.h (libmg and the bindings share it): random inserts and
 * erases against a plain array, sizing in advance, and allocation failure. */
#include "tap.h"

#include "failing_alloc.h"
#include "ptrmap.h"

#include <stdint.h>
#include <string.h>

/* Keys: addresses inside one array (8-byte multiples, as real node addresses are), so many
 * keys share low bits and probe runs wrap around the table's end. */
#define NKEYS 3000
static double keys[NKEYS];

/* xorshift: a fixed sequence, the same on every platform */
static uint64_t next_random(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Every key of the model is found with its value, and nothing else is. */
static int map_matches(const mg_ptrmap *m, const uintptr_t *model) {
    size_t len = 0;
    for (size_t k = 0; k < NKEYS; k++) {
        size_t i = mg_ptrmap_find(m, &keys[k]);
        if (model[k] == 0 ? i != MG_PTRMAP_NONE
                          : i == MG_PTRMAP_NONE || m->slots[i].val != model[k])
            return 0;
        len += model[k] != 0;
    }
    return len == m->len;
}

static void test_ptrmap__random_inserts_and_erases_match_an_array(void) {
    const mg_allocator *a = mg_default_allocator();
    mg_ptrmap m = MG_PTRMAP_INIT;
    uintptr_t model[NKEYS] = {0}; /* 0: absent */
    uint64_t s = 88172645463325252u;
    int ok = 1;
    for (int step = 0; step < 200000 && ok; step++) {
        size_t k = (size_t)(next_random(&s) % NKEYS);
        /* phases that grow the map, then ones that mostly erase: long probe runs get holes */
        int erase = (int)(next_random(&s) % 100) < ((step / 20000) % 2 ? 80 : 30);
        if (erase) {
            size_t i = mg_ptrmap_find(&m, &keys[k]);
            ok &= (i == MG_PTRMAP_NONE) == (model[k] == 0);
            if (i != MG_PTRMAP_NONE) mg_ptrmap_erase_at(&m, i);
            model[k] = 0;
        } else {
            int added = -1;
            uintptr_t *v = mg_ptrmap_put(&m, &keys[k], a, &added);
            ok &= v != NULL && added == (model[k] == 0);
            if (v) *v = model[k] = (uintptr_t)step + 1;
        }
        if (step % 997 == 0) ok &= map_matches(&m, model);
    }
    CHECK(ok);
    CHECK(map_matches(&m, model));
    CHECK(m.cap && (m.cap & (m.cap - 1)) == 0 && m.len * 4 <= m.cap * 3);
    mg_ptrmap_free(&m, a);
    CHECK(m.slots == NULL && m.len == 0 && mg_ptrmap_find(&m, &keys[0]) == MG_PTRMAP_NONE);
}

static void test_ptrmap__null_keys_and_empty_maps(void) {
    const mg_allocator *a = mg_default_allocator();
    mg_ptrmap m = MG_PTRMAP_INIT;
    CHECK(mg_ptrmap_find(&m, &keys[1]) == MG_PTRMAP_NONE);
    int added = 1;
    CHECK(mg_ptrmap_put(&m, NULL, a, &added) == NULL && added == 0 && m.len == 0);
    CHECK(mg_ptrmap_find(&m, NULL) == MG_PTRMAP_NONE);
    mg_ptrmap_free(&m, a); /* nothing allocated: a no-op */
    mg_ptrmap_free(&m, a);
}

static void test_ptrmap__sized_in_advance_it_never_reallocates(void) {
    failing_alloc fa = {0};
    mg_allocator a = failing_allocator(&fa);
    mg_ptrmap m = MG_PTRMAP_INIT;
    CHECK(mg_ptrmap_reserve(&m, NKEYS, &a));
    CHECK(fa.count == 1 && m.cap >= 2 * NKEYS);
    mg_ptrmap_slot *slots = m.slots;
    for (size_t k = 0; k < NKEYS; k++) *mg_ptrmap_put(&m, &keys[k], &a, NULL) = k + 1;
    CHECK(fa.count == 1 && m.slots == slots && m.len == NKEYS);
    CHECK(mg_ptrmap_reserve(&m, 10, &a) && fa.count == 1); /* big enough already */
    mg_ptrmap_free(&m, &a);
    CHECK(fa.live == 0);
}

static void test_ptrmap__a_failed_allocation_leaves_the_map_as_it_was(void) {
    failing_alloc fa = {0};
    mg_allocator a = failing_allocator(&fa);
    mg_ptrmap m = MG_PTRMAP_INIT;
    size_t k = 0, failures = 0;
    for (int round = 0; round < 6; round++) {
        /* fill up to the next growth, then fail the growth once */
        while (k < NKEYS) {
            fa.fail_at = fa.count + 1;
            int added = -1;
            uintptr_t *v = mg_ptrmap_put(&m, &keys[k], &a, &added);
            if (!v) {
                failures++;
                CHECK(added == 0 && m.len == k && mg_ptrmap_find(&m, &keys[k]) == MG_PTRMAP_NONE);
                for (size_t j = 0; j < k; j++) {
                    size_t i = mg_ptrmap_find(&m, &keys[j]);
                    CHECK(i != MG_PTRMAP_NONE && m.slots[i].val == j + 1);
                }
                fa.fail_at = 0;
                break;
            }
            *v = ++k;
        }
        fa.fail_at = 0;
        uintptr_t *v = mg_ptrmap_put(&m, &keys[k], &a, NULL); /* the retry grows the map */
        CHECK(v != NULL);
        if (v) *v = ++k;
    }
    CHECK(failures == 6 && m.len == k);
    mg_ptrmap_free(&m, &a);
    CHECK(fa.live == 0);
}

int main(void) {
    RUN(test_ptrmap__random_inserts_and_erases_match_an_array);
    RUN(test_ptrmap__null_keys_and_empty_maps);
    RUN(test_ptrmap__sized_in_advance_it_never_reallocates);
    RUN(test_ptrmap__a_failed_allocation_leaves_the_map_as_it_was);
    TAP_DONE();
}
