/* A map from pointers to pointer-sized values: open addressing, linear probing, backward-shift
 * deletion (no tombstones, so a map that sees as many erases as inserts never degrades).
 *
 * The one pointer map of the project, for libmg (C) and the bindings (C++): static inline, no
 * exceptions, every allocation through the mg_allocator the caller passes, a failed allocation
 * reported and the map left as it was. Keys are compared by address and never dereferenced;
 * NULL is not a key. The bindings' node -> handle map (bindings/value.cpp) is this map rather
 * than a std container: it is erased from in every handle's deallocation, where nothing may throw,
 * and sees as many erases as inserts; so is their node -> label map. freeze.c's slot maps are this
 * map too, sized in advance.
 *
 *     mg_ptrmap m = MG_PTRMAP_INIT;
 *     int added;
 *     uintptr_t *v = mg_ptrmap_put(&m, key, alloc, &added); // NULL: out of memory
 *     if (v) *v = value;                                     // a new entry, or the existing one
 *     size_t i = mg_ptrmap_find(&m, key);                    // MG_PTRMAP_NONE when absent
 *     if (i != MG_PTRMAP_NONE) mg_ptrmap_erase_at(&m, i);    // m.slots[i].val before, if needed
 *     mg_ptrmap_free(&m, alloc);
 */
#ifndef MG_PTRMAP_H
#define MG_PTRMAP_H

#include "mg/common.h"

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_ptrmap_slot {
    const void *key; /* NULL: empty */
    uintptr_t val;
} mg_ptrmap_slot;

typedef struct mg_ptrmap {
    mg_ptrmap_slot *slots; /* slots[cap] */
    size_t cap;            /* 0 or a power of two */
    size_t len;            /* entries */
} mg_ptrmap;

#define MG_PTRMAP_INIT {NULL, 0, 0}
/* What mg_ptrmap_find() returns for an absent key. */
#define MG_PTRMAP_NONE ((size_t)-1)

/* Fibonacci hashing: addresses are multiples of their alignment, so the low bits are poor; the
 * multiplication moves the well-mixed middle bits up. */
static inline size_t mg_ptrmap__home(const mg_ptrmap *m, const void *key) {
    uint64_t h = (uint64_t)(uintptr_t)key * UINT64_C(0x9E3779B97F4A7C15);
    return (size_t)(h >> 32) & (m->cap - 1);
}

/* Moves every entry into `slots` (cap entries, zeroed), which the map takes over. */
static inline void mg_ptrmap__rehash(mg_ptrmap *m, mg_ptrmap_slot *slots, size_t cap,
                                     const mg_allocator *a) {
    mg_ptrmap_slot *old = m->slots;
    size_t old_cap = m->cap;
    m->slots = slots;
    m->cap = cap;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].key) continue;
        size_t j = mg_ptrmap__home(m, old[i].key);
        while (slots[j].key) j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    if (old) a->free_fn(old, a->ctx);
}

/* Makes room for `n` entries at a load of at most one half, so that filling a map sized in
 * advance never rehashes. Returns 1, or 0 when out of memory (the map is unchanged). */
static inline int mg_ptrmap_reserve(mg_ptrmap *m, size_t n, const mg_allocator *a) {
    size_t cap = 16;
    while (cap / 2 < n) {
        if (cap > SIZE_MAX / 2 / sizeof(mg_ptrmap_slot)) return 0;
        cap *= 2;
    }
    if (cap <= m->cap) return 1;
    mg_ptrmap_slot *slots = (mg_ptrmap_slot *)a->malloc_fn(cap * sizeof *slots, a->ctx);
    if (!slots) return 0;
    memset(slots, 0, cap * sizeof *slots);
    mg_ptrmap__rehash(m, slots, cap, a);
    return 1;
}

/* The index of `key`'s entry (its value is m->slots[i].val), or MG_PTRMAP_NONE. */
static inline size_t mg_ptrmap_find(const mg_ptrmap *m, const void *key) {
    if (!m->cap || !key) return MG_PTRMAP_NONE;
    for (size_t i = mg_ptrmap__home(m, key);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i].key == key) return i;
        if (!m->slots[i].key) return MG_PTRMAP_NONE;
    }
}

/* The value of `key`'s entry, inserted (with value 0) when absent; *added tells which (may be
 * NULL). Past a load of three quarters the map doubles. Returns NULL for a NULL key and when
 * growing fails (nothing is inserted then). The pointer is valid until the next put or reserve. */
static inline uintptr_t *mg_ptrmap_put(mg_ptrmap *m, const void *key, const mg_allocator *a,
                                       int *added) {
    if (added) *added = 0;
    if (!key) return NULL;
    size_t i = mg_ptrmap_find(m, key);
    if (i != MG_PTRMAP_NONE) return &m->slots[i].val;
    if ((m->len + 1) * 4 > m->cap * 3 && !mg_ptrmap_reserve(m, m->len + 1, a)) return NULL;
    for (i = mg_ptrmap__home(m, key); m->slots[i].key; i = (i + 1) & (m->cap - 1)) continue;
    m->slots[i].key = key;
    m->slots[i].val = 0;
    m->len++;
    if (added) *added = 1;
    return &m->slots[i].val;
}

/* Removes the entry at index `i` (from mg_ptrmap_find()). Later entries of its probe run move back
 * into the hole, so indices from before the call are stale. */
static inline void mg_ptrmap_erase_at(mg_ptrmap *m, size_t i) {
    size_t mask = m->cap - 1, j = i;
    m->len--;
    for (;;) {
        m->slots[i].key = NULL;
        for (;;) {
            j = (j + 1) & mask;
            if (!m->slots[j].key) return;
            size_t home = mg_ptrmap__home(m, m->slots[j].key);
            /* j's entry may fill the hole at i unless its home lies cyclically in (i, j] */
            int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
            if (!stays) break;
        }
        m->slots[i] = m->slots[j];
        i = j;
    }
}

/* Frees the slots; the map is empty and usable again. NULL-safe on an empty map. */
static inline void mg_ptrmap_free(mg_ptrmap *m, const mg_allocator *a) {
    if (m->slots) a->free_fn(m->slots, a->ctx);
    m->slots = NULL;
    m->cap = m->len = 0;
}

#ifdef __cplusplus
}
#endif

#endif /* MG_PTRMAP_H */
