/**
 * @file common.h
 * @brief Export macros, status codes and the allocator hook shared by every libmg module.
 *
 * @defgroup common Common definitions
 * @brief Status codes, the status table and the allocator hook.
 * @{
 */
#ifndef MG_COMMON_H
#define MG_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks a symbol exported from the shared library. */
#if defined(_WIN32) && defined(MG_BUILDING_SHARED)
#define MG_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define MG_API __attribute__((visibility("default")))
#else
#define MG_API
#endif

/**
 * The status table: one row per status, `X(NAME, code, message)`.
 * It generates the `MG_*` status constants, mg_status_name() and mg_strerror().
 */
#define MG_STATUS_LIST(X)                                                                          \
    X(OK, 0, "success")                                                                            \
    X(ENOMEM, -1, "out of memory")                                                                 \
    X(EINVAL, -2, "invalid argument")                                                              \
    X(ERANGE, -3, "value out of range")                                                            \
    X(ESTALE, -4, "value was released (stale handle)")                                             \
    X(EFORMAT, -5, "malformed input")                                                              \
    X(EIO, -6, "input/output error")

#define MG__STATUS_ENUM(name, code, msg) MG_##name = (code),
/** Status codes returned by fallible libmg calls: MG_OK (0) or a negative error. */
typedef enum mg_status {
    /* clang-format off */
    MG_STATUS_LIST(MG__STATUS_ENUM)
    MG__STATUS_MIN = -7 /**< One below the lowest status; not a status. */
    /* clang-format on */
} mg_status;
#undef MG__STATUS_ENUM

/**
 * @brief Name of a status code, such as `"ENOMEM"`.
 * @param status a status code
 * @return a static string; `"UNKNOWN"` for codes not in the table. Never NULL, never freed.
 */
MG_API const char *mg_status_name(int status);

/**
 * @brief Human-readable description of a status code.
 * @param status a status code
 * @return a static string; never NULL, never freed.
 */
MG_API const char *mg_strerror(int status);

/**
 * @brief Memory functions a graph allocates through.
 *
 * Every allocation libmg makes on behalf of a graph (value blocks, operand arrays, backward
 * working memory, MLP structs, tapes) goes through the graph's allocator, so tests can fail the
 * k-th allocation and check that nothing leaks and the graph stays intact.
 */
typedef struct mg_allocator {
    /** Allocates @p size bytes; returns NULL on failure. */
    void *(*malloc_fn)(size_t size, void *ctx);
    /** Resizes @p ptr (NULL allowed) to @p size bytes; returns NULL on failure, leaving @p ptr
     * valid. */
    void *(*realloc_fn)(void *ptr, size_t size, void *ctx);
    /** Frees @p ptr; NULL is a no-op. */
    void (*free_fn)(void *ptr, void *ctx);
    /** Opaque pointer passed to each function. */
    void *ctx;
} mg_allocator;

/**
 * @brief The default allocator (the C library's malloc, realloc and free).
 * @return a pointer to a static allocator; never freed.
 */
MG_API const mg_allocator *mg_default_allocator(void);

#ifdef __cplusplus
}
#endif

/** @} */
#endif /* MG_COMMON_H */
