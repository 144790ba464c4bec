// pytest-gradgate shim: see gradgate.h for why it exists.
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#ifdef GRADGATE_HAVE_GGML_OPT
#include "ggml-opt.h"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gradgate.h"

#define GG_ABI_VERSION 9

int gg_abi_version(void) { return GG_ABI_VERSION; }

const char * gg_ggml_version(void) { return ggml_version(); }

// room for four graphs: the case's forward and backward, and the power probe's (engine.py)
struct ggml_context * gg_ctx_new(size_t n_tensors, size_t graph_size) {
    struct ggml_init_params params = {
        /* .mem_size   = */ ggml_tensor_overhead() * n_tensors + 4 * ggml_graph_overhead_custom(graph_size, true),
        /* .mem_buffer = */ NULL,
        /* .no_alloc   = */ true,
    };
    return ggml_init(params);
}

void gg_ctx_free(struct ggml_context * ctx) { ggml_free(ctx); }

struct ggml_tensor * gg_new_tensor(struct ggml_context * ctx, int is_i32, int n_dims, const int64_t * ne) {
    return ggml_new_tensor(ctx, is_i32 ? GGML_TYPE_I32 : GGML_TYPE_F32, n_dims, ne);
}

void gg_tensor_layout(const struct ggml_tensor * t, int64_t * ne, size_t * nb) {
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        ne[i] = t->ne[i];
        nb[i] = t->nb[i];
    }
}

size_t gg_tensor_nbytes(const struct ggml_tensor * t) { return ggml_nbytes(t); }

int gg_tensor_is_f32(const struct ggml_tensor * t) { return t->type == GGML_TYPE_F32; }

const char * gg_tensor_op_name(const struct ggml_tensor * t) { return ggml_op_desc(t); }

struct ggml_cgraph * gg_graph_forward(struct ggml_context * ctx, struct ggml_tensor * loss, size_t graph_size) {
    struct ggml_cgraph * gf = ggml_new_graph_custom(ctx, graph_size, true);
    ggml_set_loss(loss);
    ggml_build_forward_expand(gf, loss);
    return gf;
}

struct ggml_cgraph * gg_graph_backward(struct ggml_context * graph_ctx, struct ggml_context * ctx, struct ggml_cgraph * gf,
                                       size_t graph_size) {
    struct ggml_cgraph * gb = ggml_new_graph_custom(graph_ctx, graph_size, true);
    ggml_graph_cpy(gf, gb);
    ggml_build_backward_expand(ctx, gb, NULL);
    return gb;
}

int gg_graph_n_nodes(struct ggml_cgraph * g) { return ggml_graph_n_nodes(g); }

struct gg_session {
    ggml_backend_t backend;
    ggml_backend_buffer_t buffer;
    int n_threads;
    // the finite differences run one forward graph thousands of times: on the CPU its plan
    // (a walk over every node, and the work buffer's size) is made once per graph, not per run
    struct ggml_cgraph * planned;
    int planned_threads;
    struct ggml_cplan plan;
    uint8_t * work;
    size_t work_size;
    // memory checks (gg_session_alloc): the tensors that own memory in the buffer, a guard zone
    // before and after each one's data (tensors of guard_ctx, so any backend reads them)
    struct ggml_context * guard_ctx;
    int n_guarded;
    struct ggml_tensor ** guarded;
    struct ggml_tensor ** guard_before;
    struct ggml_tensor ** guard_after;
    size_t guard_bytes;
    uint8_t * scratch;          // guard_bytes, or a node's data (gg_session_unwritten)
    size_t scratch_size;
    // one node at a time (gg_session_guard_replay)
    struct ggml_context * one_ctx;
    struct ggml_cgraph * one;
    // the allocation regimes (gg_session_alloc_graph): the static tensors' buffer, and ggml's
    // graph allocator, which owns the buffer of everything else
    ggml_backend_buffer_t static_buffer;
    ggml_gallocr_t galloc;
};

static void gg_guards_free(struct gg_session * s);
static void gg_regime_free(struct gg_session * s);

int gg_backend_count_gpu(void) {
    int n = 0;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        if (ggml_backend_dev_type(ggml_backend_dev_get(i)) == GGML_BACKEND_DEVICE_TYPE_GPU) {
            n++;
        }
    }
    return n;
}

struct gg_session * gg_session_new(const char * backend, int n_threads, char * err, size_t err_len) {
    ggml_backend_t b = NULL;
    if (strcmp(backend, "cpu") == 0) {
        b = ggml_backend_cpu_init();
        if (b) {
            ggml_backend_cpu_set_n_threads(b, n_threads);
        }
    } else if (strcmp(backend, "cuda") == 0) {
        b = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_GPU, NULL);
    } else {
        snprintf(err, err_len, "unknown backend '%s' (expected cpu or cuda)", backend);
        return NULL;
    }
    if (!b) {
        snprintf(err, err_len, "backend '%s' could not be initialised (%d GPU devices in this build)",
                 backend, gg_backend_count_gpu());
        return NULL;
    }
    struct gg_session * s = calloc(1, sizeof(*s));
    s->backend = b;
    s->n_threads = n_threads;
    return s;
}

void gg_session_set_n_threads(struct gg_session * s, int n_threads) {
    // the CPU backend splits rows between threads; other backends ignore it
    if (ggml_backend_is_cpu(s->backend)) {
        ggml_backend_cpu_set_n_threads(s->backend, n_threads);
    }
    s->n_threads = n_threads;
}

void gg_session_free(struct gg_session * s) {
    if (!s) {
        return;
    }
    gg_regime_free(s);
    if (s->one_ctx) {
        ggml_free(s->one_ctx);
    }
    ggml_backend_free(s->backend);
    free(s->work);
    free(s);
}

const char * gg_session_backend_name(struct gg_session * s) { return ggml_backend_name(s->backend); }

struct ggml_tensor * gg_session_first_unsupported(struct gg_session * s, struct ggml_context * ctx) {
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op != GGML_OP_NONE && !ggml_backend_supports_op(s->backend, t)) {
            return t;
        }
    }
    return NULL;
}

// ---- memory checks ------------------------------------------------------------------------
// Every tensor that owns memory gets a guard zone of its own before and after its data, filled
// with a pattern that depends on the tensor and the side, so a kernel that copies one tensor's
// zone into another's (a pass-through loop one element too long reads past its source and
// writes past its destination) still changes a zone. No pattern byte is 0xFF, so no guard word
// reads as GG_UNWRITTEN.
#define GG_GUARD_BYTES 256
#define GG_UNWRITTEN_BYTE 0xFF      // every tensor's data starts as 0xFFFFFFFF words: a NaN no kernel makes

static void gg_guards_free(struct gg_session * s) {
    if (s->guard_ctx) {
        ggml_free(s->guard_ctx);
    }
    free(s->guarded);
    free(s->guard_before);
    free(s->guard_after);
    free(s->scratch);
    s->guard_ctx = NULL;
    s->guarded = s->guard_before = s->guard_after = NULL;
    s->scratch = NULL;
    s->scratch_size = 0;
    s->n_guarded = 0;
}

static uint8_t gg_guard_byte(int k, int side, size_t j) {
    uint32_t x = (uint32_t) k * 2654435761u ^ (uint32_t) (side + 2) * 0x9E3779B9u ^ (uint32_t) j * 0x85EBCA6Bu;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    const uint8_t b = (uint8_t) (x >> 8);
    return b == 0xFF ? 0xA5 : b;
}

static void gg_guard_pattern(int k, int side, uint8_t * out, size_t n) {
    for (size_t j = 0; j < n; j++) {
        out[j] = gg_guard_byte(k, side, j);
    }
}

static int gg_scratch(struct gg_session * s, size_t n) {
    if (n > s->scratch_size) {
        uint8_t * p = realloc(s->scratch, n);
        if (!p) {
            return 0;
        }
        s->scratch = p;
        s->scratch_size = n;
    }
    return 1;
}

void gg_session_guard_fill(struct gg_session * s) {
    if (!gg_scratch(s, s->guard_bytes)) {
        return;
    }
    for (int k = 0; k < s->n_guarded; k++) {
        gg_guard_pattern(k, -1, s->scratch, s->guard_bytes);
        ggml_backend_tensor_set(s->guard_before[k], s->scratch, 0, s->guard_bytes);
        gg_guard_pattern(k, +1, s->scratch, s->guard_bytes);
        ggml_backend_tensor_set(s->guard_after[k], s->scratch, 0, s->guard_bytes);
    }
}

static size_t gg_pad(size_t n, size_t align) { return (n + align - 1) / align * align; }

static int gg_owns_memory(const struct ggml_tensor * t) { return t->data == NULL && t->view_src == NULL; }

// Everything a session allocated for a context: its own-memory buffer and guard zones, or a
// regime's static buffer and graph allocator.
static void gg_regime_free(struct gg_session * s) {
    if (s->buffer) {
        ggml_backend_buffer_free(s->buffer);
        s->buffer = NULL;
    }
    gg_guards_free(s);
    if (s->galloc) {
        ggml_gallocr_free(s->galloc);
        s->galloc = NULL;
    }
    if (s->static_buffer) {
        ggml_backend_buffer_free(s->static_buffer);
        s->static_buffer = NULL;
    }
    s->planned = NULL;   // a plan is for a graph of the context allocated before
}

void gg_session_release(struct gg_session * s) { gg_regime_free(s); }

// the tensor whose memory node k of an alias plan takes (NULL: t owns memory of its own)
static struct ggml_tensor * gg_alias_target(struct ggml_tensor * t, struct ggml_tensor * const * nodes,
                                            struct ggml_tensor * const * targets, int n) {
    for (int k = 0; k < n; k++) {
        if (nodes[k] == t) {
            return targets[k];
        }
    }
    return NULL;
}

static int gg_session_alloc_impl(struct gg_session * s, struct ggml_context * ctx, struct ggml_tensor * const * alias_nodes,
                                 struct ggml_tensor * const * alias_targets, int n_alias);

int gg_session_alloc(struct gg_session * s, struct ggml_context * ctx) {
    return gg_session_alloc_impl(s, ctx, NULL, NULL, 0);
}

static int gg_session_alloc_impl(struct gg_session * s, struct ggml_context * ctx, struct ggml_tensor * const * alias_nodes,
                                 struct ggml_tensor * const * alias_targets, int n_alias) {
    gg_regime_free(s);
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(s->backend);
    const size_t align = ggml_backend_buft_get_alignment(buft);
    s->guard_bytes = gg_pad(GG_GUARD_BYTES, align);
    int n = 0;
    size_t size = 0;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (gg_owns_memory(t) && !gg_alias_target(t, alias_nodes, alias_targets, n_alias)) {
            n++;
            size += gg_pad(2 * s->guard_bytes + ggml_backend_buft_get_alloc_size(buft, t), align);
        }
    }
    struct ggml_init_params params = {
        /* .mem_size   = */ ggml_tensor_overhead() * (2 * (size_t) n + 1),
        /* .mem_buffer = */ NULL,
        /* .no_alloc   = */ true,
    };
    s->guard_ctx = ggml_init(params);
    s->guarded = calloc(n + 1, sizeof(*s->guarded));
    s->guard_before = calloc(n + 1, sizeof(*s->guard_before));
    s->guard_after = calloc(n + 1, sizeof(*s->guard_after));
    s->buffer = ggml_backend_buft_alloc_buffer(buft, size > 0 ? size : align);
    if (!s->guard_ctx || !s->guarded || !s->guard_before || !s->guard_after || !s->buffer) {
        return 0;
    }
    ggml_backend_buffer_clear(s->buffer, GG_UNWRITTEN_BYTE);
    char * at = (char *) ggml_backend_buffer_get_base(s->buffer);
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (!gg_owns_memory(t) || gg_alias_target(t, alias_nodes, alias_targets, n_alias)) {
            continue;
        }
        const int k = s->n_guarded++;
        s->guarded[k] = t;
        s->guard_before[k] = ggml_new_tensor_1d(s->guard_ctx, GGML_TYPE_I8, (int64_t) s->guard_bytes);
        s->guard_after[k] = ggml_new_tensor_1d(s->guard_ctx, GGML_TYPE_I8, (int64_t) s->guard_bytes);
        // the zone after starts at the data's last byte + 1, not at the next aligned address:
        // a write one element past the end must land in it, not in padding
        const size_t data_size = ggml_backend_buft_get_alloc_size(buft, t);
        ggml_backend_tensor_alloc(s->buffer, s->guard_before[k], at);
        ggml_backend_tensor_alloc(s->buffer, t, at + s->guard_bytes);
        ggml_backend_tensor_alloc(s->buffer, s->guard_after[k], at + s->guard_bytes + data_size);
        at += gg_pad(2 * s->guard_bytes + data_size, align);
    }
    // in the plan's order (graph order), so that a node laid over a node laid over a third finds
    // its target's memory already placed
    for (int k = 0; k < n_alias; k++) {
        if (alias_targets[k]->data == NULL) {
            return 0;
        }
        ggml_backend_tensor_alloc(s->buffer, alias_nodes[k], alias_targets[k]->data);
    }
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->data == NULL && t->view_src != NULL) {
            ggml_backend_view_init(t);
        }
    }
    gg_session_guard_fill(s);
    return 1;
}

int gg_session_n_guarded(struct gg_session * s) { return s->n_guarded; }

struct ggml_tensor * gg_session_guarded_tensor(struct gg_session * s, int k) {
    return k >= 0 && k < s->n_guarded ? s->guarded[k] : NULL;
}

int gg_session_guard_check(struct gg_session * s, int * k_out, int * side_out, int64_t * first, int64_t * last,
                           int64_t * n_changed) {
    if (!gg_scratch(s, 2 * s->guard_bytes)) {
        return 0;
    }
    uint8_t * got = s->scratch;
    uint8_t * want = s->scratch + s->guard_bytes;
    for (int k = 0; k < s->n_guarded; k++) {
        for (int side = -1; side <= 1; side += 2) {
            ggml_backend_tensor_get(side < 0 ? s->guard_before[k] : s->guard_after[k], got, 0, s->guard_bytes);
            gg_guard_pattern(k, side, want, s->guard_bytes);
            if (memcmp(got, want, s->guard_bytes) == 0) {
                continue;
            }
            // bytes counted away from the data: 0 is the byte next to it on that side
            int64_t lo = -1, hi = -1, count = 0;
            for (size_t j = 0; j < s->guard_bytes; j++) {
                if (got[j] != want[j]) {
                    const int64_t d = side > 0 ? (int64_t) j : (int64_t) (s->guard_bytes - 1 - j);
                    if (lo < 0 || d < lo) lo = d;
                    if (d > hi) hi = d;
                    count++;
                }
            }
            *k_out = k;
            *side_out = side;
            *first = lo;
            *last = hi;
            *n_changed = count;
            return 1;
        }
    }
    return 0;
}

int gg_session_guard_replay(struct gg_session * s, struct ggml_cgraph * g) {
    if (!s->one_ctx) {
        struct ggml_init_params params = { ggml_graph_overhead_custom(1, false), NULL, true };
        s->one_ctx = ggml_init(params);
        if (!s->one_ctx) {
            return -2;
        }
        s->one = ggml_new_graph_custom(s->one_ctx, 1, false);
    }
    int k, side;
    int64_t first, last, n_changed;
    for (int i = 0; i < ggml_graph_n_nodes(g); i++) {
        ggml_graph_clear(s->one);
        ggml_graph_add_node(s->one, ggml_graph_node(g, i));
        if (ggml_backend_graph_compute(s->backend, s->one) != GGML_STATUS_SUCCESS) {
            return -2;
        }
        if (gg_session_guard_check(s, &k, &side, &first, &last, &n_changed)) {
            return i;
        }
    }
    return -1;
}

int gg_session_unwritten(struct gg_session * s, struct ggml_cgraph * g, int64_t * n_unwritten, int64_t * first) {
    for (int i = 0; i < ggml_graph_n_nodes(g); i++) {
        struct ggml_tensor * t = ggml_graph_node(g, i);
        // a node that owns its memory in this session's buffer (gg_session_alloc guarded every
        // such tensor); a view's elements are its owner's, checked as the owner
        if (t->view_src != NULL || t->type != GGML_TYPE_F32 || t->op == GGML_OP_NONE || t->buffer != s->buffer) {
            continue;
        }
        const size_t nbytes = ggml_nbytes(t);
        if (!gg_scratch(s, nbytes)) {
            return -1;
        }
        ggml_backend_tensor_get(t, s->scratch, 0, nbytes);
        const uint32_t * w = (const uint32_t *) s->scratch;
        int64_t count = 0, at = -1;
        for (size_t j = 0; j < nbytes / 4; j++) {
            if (w[j] == 0xFFFFFFFFu) {
                if (at < 0) at = (int64_t) j;
                count++;
            }
        }
        if (count) {
            *n_unwritten = count;
            *first = at;
            return i;
        }
    }
    return -1;
}

// ---- allocation regimes (check/regimes.py) -------------------------------------------------
// Training lays the backward out with ggml's graph allocator, which lets an op write its output
// over a source whose last use it is. A kernel that writes its output before it has read all of
// that source is right in memory of its own and wrong there.

void gg_ctx_detach(struct ggml_context * ctx) {
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        t->data = NULL;
        t->buffer = NULL;
    }
}

// ggml-alloc's own list of ops it may run in place (exported by ggml-base since 2025); a tree
// without the symbol gets the list of ggml 0.15.3
bool ggml_op_can_inplace(enum ggml_op op) __attribute__((weak));

static int gg_can_inplace(enum ggml_op op) {
    if (ggml_op_can_inplace) {
        return ggml_op_can_inplace(op);
    }
    switch (op) {
        case GGML_OP_SCALE: case GGML_OP_DIAG_MASK_ZERO: case GGML_OP_DIAG_MASK_INF: case GGML_OP_ADD:
        case GGML_OP_ADD1: case GGML_OP_SUB: case GGML_OP_MUL: case GGML_OP_DIV: case GGML_OP_SQR:
        case GGML_OP_SQRT: case GGML_OP_LOG: case GGML_OP_UNARY: case GGML_OP_ROPE: case GGML_OP_ROPE_BACK:
        case GGML_OP_SILU_BACK: case GGML_OP_RMS_NORM: case GGML_OP_RMS_NORM_BACK: case GGML_OP_SOFT_MAX:
        case GGML_OP_SOFT_MAX_BACK:
            return 1;
        default:
            return 0;
    }
}

int gg_op_can_inplace(const struct ggml_tensor * t) { return gg_can_inplace(t->op); }

static struct ggml_tensor * gg_root(struct ggml_tensor * t) {
    while (t->view_src) {
        t = t->view_src;
    }
    return t;
}

// ggml_are_same_layout (ggml-impl.h, not a public header): what ggml-alloc asks of an in-place pair
static int gg_same_layout(const struct ggml_tensor * a, const struct ggml_tensor * b) {
    if (a->type != b->type) {
        return 0;
    }
    for (int i = 0; i < GGML_MAX_DIMS; i++) {
        if (a->ne[i] != b->ne[i] || a->nb[i] != b->nb[i]) {
            return 0;
        }
    }
    return 1;
}

int gg_graph_alias_candidates(struct ggml_cgraph * g, int which, struct ggml_tensor ** keep, int n_keep, int * nodes,
                              int max) {
    if (which < 0 || which >= GGML_MAX_SRC) {
        return 0;
    }
    const int n = ggml_graph_n_nodes(g);
    int count = 0;
    for (int i = 0; i < n && count < max; i++) {
        struct ggml_tensor * node = ggml_graph_node(g, i);
        struct ggml_tensor * src = node->src[which];
        if (node->view_src || node->op == GGML_OP_NONE || !gg_can_inplace(node->op) || !src || src->view_src ||
            (src->flags & GGML_TENSOR_FLAG_PARAM) || !gg_same_layout(node, src)) {
            continue;
        }
        int legal = 1;
        for (int k = 0; k < n_keep && legal; k++) {
            legal = keep[k] == NULL || gg_root(keep[k]) != src;        // read after the compute
        }
        for (int j = 0; j < GGML_MAX_SRC && legal; j++) {
            // another source that is a view into src: the kernel reads src's memory through it
            struct ggml_tensor * other = node->src[j];
            legal = j == which || !other || other == src || gg_root(other) != src;
        }
        for (int m = i + 1; m < n && legal; m++) {
            struct ggml_tensor * later = ggml_graph_node(g, m);
            legal = gg_root(later) != src;
            for (int j = 0; j < GGML_MAX_SRC && legal; j++) {
                legal = !later->src[j] || gg_root(later->src[j]) != src;
            }
        }
        if (legal) {
            nodes[count++] = i;
        }
    }
    return count;
}

int gg_session_alloc_aliased(struct gg_session * s, struct ggml_context * ctx, struct ggml_cgraph * g, const int * nodes,
                             const int * srcs, int n) {
    struct ggml_tensor ** pairs = calloc(2 * (size_t) (n > 0 ? n : 1), sizeof(*pairs));
    if (!pairs) {
        return 0;
    }
    int ok = 1;
    for (int k = 0; k < n && ok; k++) {
        ok = nodes[k] >= 0 && nodes[k] < ggml_graph_n_nodes(g) && srcs[k] >= 0 && srcs[k] < GGML_MAX_SRC;
        if (ok) {
            pairs[k] = ggml_graph_node(g, nodes[k]);
            pairs[n + k] = pairs[k]->src[srcs[k]];
            ok = pairs[n + k] && !pairs[k]->view_src && !pairs[n + k]->view_src && gg_same_layout(pairs[k], pairs[n + k]);
        }
    }
    ok = ok && gg_session_alloc_impl(s, ctx, pairs, pairs + n, n);
    free(pairs);
    return ok;
}

int gg_session_alloc_graph(struct gg_session * s, struct ggml_context * ctx, struct ggml_cgraph * g,
                           struct ggml_tensor ** statics, int n_statics, struct ggml_tensor ** outputs, int n_outputs) {
    gg_regime_free(s);
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(s->backend);
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t size = align;
    for (int k = 0; k < n_statics; k++) {
        size += gg_pad(ggml_backend_buft_get_alloc_size(buft, statics[k]), align);
    }
    s->static_buffer = ggml_backend_buft_alloc_buffer(buft, size);
    if (!s->static_buffer) {
        return 0;
    }
    struct ggml_tallocr talloc = ggml_tallocr_new(s->static_buffer);
    for (int k = 0; k < n_statics; k++) {
        if (statics[k]->data == NULL && ggml_tallocr_alloc(&talloc, statics[k]) != GGML_STATUS_SUCCESS) {
            return 0;
        }
    }
    for (int k = 0; k < n_outputs; k++) {
        ggml_set_output(outputs[k]);
    }
    // the other leaves are a training step's inputs: set each step, laid out by the allocator
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op == GGML_OP_NONE && t->data == NULL && t->view_src == NULL) {
            ggml_set_input(t);
        }
    }
    s->galloc = ggml_gallocr_new(buft);
    return s->galloc != NULL && ggml_gallocr_alloc_graph(s->galloc, g);
}

int gg_graph_aliases(struct ggml_cgraph * g, int * nodes, int * srcs, int max) {
    int count = 0;
    for (int i = 0; i < ggml_graph_n_nodes(g) && count < max; i++) {
        struct ggml_tensor * node = ggml_graph_node(g, i);
        if (node->view_src || node->op == GGML_OP_NONE || node->data == NULL) {
            continue;
        }
        for (int j = 0; j < GGML_MAX_SRC; j++) {
            if (node->src[j] && node->src[j]->data == node->data) {
                nodes[count] = i;
                srcs[count] = j;
                count++;
                break;
            }
        }
    }
    return count;
}

// ---- ggml-opt's own path (check/regimes.py) -------------------------------------------------
// The case's graph trained as llama.cpp trains: ggml_opt_init over a backend scheduler, its own
// gradient graph with gradient accumulators, SGD with weight decay 0. Leaves (params, inputs,
// constants) live in a static buffer, as ggml-opt asks of a model's context.
#ifdef GRADGATE_HAVE_GGML_OPT
int gg_opt_supported(void) { return 1; }

struct gg_opt {
    ggml_backend_sched_t sched;
    ggml_opt_context_t opt;
    ggml_backend_buffer_t static_buffer;
    struct ggml_context * input_ctx;    // the inputs tensor ggml-opt asks for: one float nothing reads
    struct ggml_opt_optimizer_params pars;
};

void gg_opt_free(struct gg_opt * o) {
    if (!o) {
        return;
    }
    if (o->opt) {
        ggml_opt_free(o->opt);
    }
    if (o->sched) {
        ggml_backend_sched_free(o->sched);
    }
    if (o->static_buffer) {
        ggml_backend_buffer_free(o->static_buffer);
    }
    if (o->input_ctx) {
        ggml_free(o->input_ctx);
    }
    free(o);
}

struct gg_opt * gg_opt_new(struct gg_session * s, struct ggml_context * ctx, struct ggml_tensor * outputs, int opt_period,
                           float lr) {
    struct gg_opt * o = calloc(1, sizeof(*o));
    if (!o) {
        return NULL;
    }
    struct ggml_init_params params = { ggml_tensor_overhead(), NULL, true };
    o->input_ctx = ggml_init(params);
    struct ggml_tensor * inputs = o->input_ctx ? ggml_new_tensor_1d(o->input_ctx, GGML_TYPE_F32, 1) : NULL;
    ggml_backend_buffer_type_t buft = ggml_backend_get_default_buffer_type(s->backend);
    const size_t align = ggml_backend_buft_get_alignment(buft);
    size_t size = 2 * align + ggml_backend_buft_get_alloc_size(buft, inputs ? inputs : outputs);
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op == GGML_OP_NONE && t->view_src == NULL && t->data == NULL) {
            size += gg_pad(ggml_backend_buft_get_alloc_size(buft, t), align);
        }
    }
    o->static_buffer = inputs ? ggml_backend_buft_alloc_buffer(buft, size) : NULL;
    if (!o->static_buffer) {
        gg_opt_free(o);
        return NULL;
    }
    struct ggml_tallocr talloc = ggml_tallocr_new(o->static_buffer);
    int ok = ggml_tallocr_alloc(&talloc, inputs) == GGML_STATUS_SUCCESS;
    for (struct ggml_tensor * t = ggml_get_first_tensor(ctx); t && ok; t = ggml_get_next_tensor(ctx, t)) {
        if (t->op == GGML_OP_NONE && t->view_src == NULL && t->data == NULL) {
            ok = ggml_tallocr_alloc(&talloc, t) == GGML_STATUS_SUCCESS;
        }
    }
    ggml_backend_t backend = s->backend;
    o->sched = ok ? ggml_backend_sched_new(&backend, NULL, 1, GGML_DEFAULT_GRAPH_SIZE, false, true) : NULL;
    if (!o->sched) {
        gg_opt_free(o);
        return NULL;
    }
    o->pars = ggml_opt_get_default_optimizer_params(NULL);
    o->pars.sgd.alpha = lr;
    o->pars.sgd.wd = 0.0f;
    struct ggml_opt_params p = ggml_opt_default_params(o->sched, GGML_OPT_LOSS_TYPE_SUM);
    p.ctx_compute = ctx;
    p.inputs = inputs;
    p.outputs = outputs;
    p.build_type = GGML_OPT_BUILD_TYPE_OPT;
    p.opt_period = opt_period;
    p.optimizer = GGML_OPT_OPTIMIZER_TYPE_SGD;
    p.get_opt_pars = ggml_opt_get_constant_optimizer_params;
    p.get_opt_pars_ud = &o->pars;
    o->opt = ggml_opt_init(p);
    return o;
}

// one micro-batch: forward, backward, accumulation (and on the period's last, the SGD step)
void gg_opt_step(struct gg_opt * o) {
    ggml_opt_alloc(o->opt, true);
    ggml_opt_eval(o->opt, NULL);
}

struct ggml_tensor * gg_opt_grad_acc(struct gg_opt * o, struct ggml_tensor * param) {
    return ggml_opt_grad_acc(o->opt, param);
}

#else
// a tree whose ggml-opt predates its SGD optimizer: no ggml-opt path (gg_opt_supported says so)
struct gg_opt { int unused; };
int gg_opt_supported(void) { return 0; }
struct gg_opt * gg_opt_new(struct gg_session * s, struct ggml_context * ctx, struct ggml_tensor * outputs, int opt_period,
                           float lr) {
    (void) s; (void) ctx; (void) outputs; (void) opt_period; (void) lr;
    return NULL;
}
void gg_opt_step(struct gg_opt * o) { (void) o; }
struct ggml_tensor * gg_opt_grad_acc(struct gg_opt * o, struct ggml_tensor * param) { (void) o; (void) param; return NULL; }
void gg_opt_free(struct gg_opt * o) { (void) o; }
#endif

struct ggml_tensor * gg_graph_node(struct ggml_cgraph * g, int i) { return ggml_graph_node(g, i); }

struct ggml_tensor * gg_tensor_src(const struct ggml_tensor * t, int j) {
    return j >= 0 && j < GGML_MAX_SRC ? t->src[j] : NULL;
}

const char * gg_tensor_name(const struct ggml_tensor * t) { return ggml_get_name(t); }

int gg_session_compute(struct gg_session * s, struct ggml_cgraph * g) {
    return (int) ggml_backend_graph_compute(s->backend, g);
}

void gg_tensor_write(struct ggml_tensor * t, const void * data, size_t offset, size_t size) {
    ggml_backend_tensor_set(t, data, offset, size);
}

void gg_tensor_read(const struct ggml_tensor * t, void * data, size_t offset, size_t size) {
    ggml_backend_tensor_get(t, data, offset, size);
}

double gg_read_scalar(struct ggml_tensor * t) {
    float v = 0.0f;
    ggml_backend_tensor_get(t, &v, 0, sizeof(v));
    return v;
}

// byte offset of logical element i (i0 fastest) through the tensor's strides
static size_t gg_offset(const struct ggml_tensor * t, int64_t i) {
    const int64_t i0 = i % t->ne[0];
    const int64_t i1 = (i / t->ne[0]) % t->ne[1];
    const int64_t i2 = (i / (t->ne[0] * t->ne[1])) % t->ne[2];
    const int64_t i3 = i / (t->ne[0] * t->ne[1] * t->ne[2]);
    return i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
}

// One forward of the finite differences. On the CPU backend: ggml_graph_compute with the plan
// made once for this graph and thread count (what ggml_backend_graph_compute does, minus
// ggml_graph_plan on every call); other backends: ggml_backend_graph_compute.
static int gg_forward(struct gg_session * s, struct ggml_cgraph * gf) {
    if (!ggml_backend_is_cpu(s->backend)) {
        return (int) ggml_backend_graph_compute(s->backend, gf);
    }
    if (s->planned != gf || s->planned_threads != s->n_threads) {
        struct ggml_cplan plan = ggml_graph_plan(gf, s->n_threads, NULL);
        if (plan.work_size > s->work_size) {
            free(s->work);
            s->work = malloc(plan.work_size);
            s->work_size = s->work ? plan.work_size : 0;
            if (!s->work) {
                s->planned = NULL;
                return (int) GGML_STATUS_ALLOC_FAILED;
            }
        }
        plan.work_data = s->work;
        s->plan = plan;
        s->planned = gf;
        s->planned_threads = s->n_threads;
    }
    struct ggml_cplan plan = s->plan;   // ggml_graph_compute may write to it
    return (int) ggml_graph_compute(gf, &plan);
}

static double gg_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

// CPU seconds of the calling thread: a lane's own work, not the time it waited for a core
static double gg_thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double) ts.tv_sec + 1e-9 * (double) ts.tv_nsec;
}

double gg_bare_compute_seconds(struct ggml_cgraph * gf, int n_threads, int n_runs) {
    struct ggml_cplan plan = ggml_graph_plan(gf, n_threads, NULL);
    uint8_t * work = plan.work_size ? malloc(plan.work_size) : NULL;
    if (plan.work_size && !work) {
        return -1.0;
    }
    plan.work_data = work;
    int st = 0;
    const double started = gg_seconds();
    for (int k = 0; k < n_runs && !st; k++) {
        struct ggml_cplan p = plan;
        st = (int) ggml_graph_compute(gf, &p);
    }
    const double took = gg_seconds() - started;
    free(work);
    return st ? -1.0 : took / (n_runs > 0 ? n_runs : 1);
}

static int gg_loss_at(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                      struct ggml_tensor * loss, size_t off, float v, double * out) {
    ggml_backend_tensor_set(param, &v, off, sizeof(v));
    const int st = gg_forward(s, gf);
    *out = gg_read_scalar(loss);
    return st;
}

static int gg_numeric_one(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                          struct ggml_tensor * loss, float h, int64_t i, double * g_h, double * g_half) {
    const size_t off = gg_offset(param, i);
    float x0;
    ggml_backend_tensor_get(param, &x0, off, sizeof(x0));
    // the perturbed values are rounded to f32, exactly as test-backend-ops does
    double fu = 0, fd = 0, fuh = 0, fdh = 0;
    int st = gg_loss_at(s, gf, param, loss, off, x0 + h, &fu);
    if (!st) st = gg_loss_at(s, gf, param, loss, off, x0 - h, &fd);
    if (!st && g_half) st = gg_loss_at(s, gf, param, loss, off, x0 + 0.5f * h, &fuh);
    if (!st && g_half) st = gg_loss_at(s, gf, param, loss, off, x0 - 0.5f * h, &fdh);
    ggml_backend_tensor_set(param, &x0, off, sizeof(x0));
    *g_h = (fu - fd) / (2.0 * (double) h);
    if (g_half) *g_half = (fuh - fdh) / (double) h;
    return st;
}

int gg_numeric_grad(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                    struct ggml_tensor * loss, float h, double * g_h, double * g_half) {
    const int64_t n = ggml_nelements(param);
    for (int64_t i = 0; i < n; i++) {
        const int st = gg_numeric_one(s, gf, param, loss, h, i, &g_h[i], g_half ? &g_half[i] : NULL);
        if (st) return st;
    }
    return 0;
}

int gg_numeric_grad_at(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                       struct ggml_tensor * loss, float h, const int64_t * idx, int64_t n_idx,
                       double * g_h, double * g_half) {
    for (int64_t k = 0; k < n_idx; k++) {
        const int st = gg_numeric_one(s, gf, param, loss, h, idx[k], &g_h[k], g_half ? &g_half[k] : NULL);
        if (st) return st;
    }
    return 0;
}

int gg_loss_even_at(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                    struct ggml_tensor * loss, float h, const int64_t * idx, int64_t n_idx, double * even) {
    if (n_idx <= 0) return 0;
    // the loss at the inputs as they are: the same for every element, so computed once
    const size_t off0 = gg_offset(param, idx[0]);
    float v0;
    ggml_backend_tensor_get(param, &v0, off0, sizeof(v0));
    double f0 = 0;
    int st = gg_loss_at(s, gf, param, loss, off0, v0, &f0);
    for (int64_t k = 0; k < n_idx && !st; k++) {
        const size_t off = gg_offset(param, idx[k]);
        float x0;
        ggml_backend_tensor_get(param, &x0, off, sizeof(x0));
        double fu = 0, fd = 0;
        st = gg_loss_at(s, gf, param, loss, off, x0 + h, &fu);
        if (!st) st = gg_loss_at(s, gf, param, loss, off, x0 - h, &fd);
        ggml_backend_tensor_set(param, &x0, off, sizeof(x0));
        even[k] = fu + fd - 2.0 * f0;
    }
    return st;
}

#define GG_MAX_LANES 8
#define GG_LANE_CHUNK 8     // elements a lane takes at a time: few atomics, little idle at the end

struct gg_lanes_job {
    struct gg_session ** sessions;
    struct ggml_cgraph ** graphs;
    struct ggml_tensor ** params;
    struct ggml_tensor ** losses;
    int64_t n;
    float h;
    double * g_h;
    double * g_half;
    atomic_llong next;      // the next element no lane has taken
    atomic_int status;      // the first failing lane's ggml_status; the others stop at their next chunk
};

struct gg_lane {
    struct gg_lanes_job * job;
    int k;
    double busy;
};

static void * gg_lane_run(void * arg) {
    struct gg_lane * lane = arg;
    struct gg_lanes_job * job = lane->job;
    const int k = lane->k;
    const double started = gg_thread_seconds();
    while (!atomic_load(&job->status)) {
        const int64_t i0 = atomic_fetch_add(&job->next, GG_LANE_CHUNK);
        if (i0 >= job->n) break;
        const int64_t i1 = i0 + GG_LANE_CHUNK < job->n ? i0 + GG_LANE_CHUNK : job->n;
        int st = 0;
        for (int64_t i = i0; i < i1 && !st; i++) {
            st = gg_numeric_one(job->sessions[k], job->graphs[k], job->params[k], job->losses[k], job->h, i,
                                &job->g_h[i], job->g_half ? &job->g_half[i] : NULL);
        }
        if (st) {
            int none = 0;
            atomic_compare_exchange_strong(&job->status, &none, st);
        }
    }
    lane->busy = gg_thread_seconds() - started;
    return NULL;
}

int gg_numeric_grad_lanes(struct gg_session ** sessions, struct ggml_cgraph ** graphs, struct ggml_tensor ** params,
                          struct ggml_tensor ** losses, int n_lanes, float h, double * g_h, double * g_half,
                          double * busy) {
    struct gg_lanes_job job = { sessions, graphs, params, losses, ggml_nelements(params[0]), h, g_h, g_half };
    atomic_init(&job.next, 0);
    atomic_init(&job.status, 0);
    if (n_lanes < 1) n_lanes = 1;
    if (n_lanes > GG_MAX_LANES) n_lanes = GG_MAX_LANES;
    struct gg_lane lanes[GG_MAX_LANES];
    pthread_t threads[GG_MAX_LANES];
    int started = 1;
    for (int k = 0; k < n_lanes; k++) {
        lanes[k] = (struct gg_lane) { &job, k, 0.0 };
    }
    // a lane whose thread cannot start leaves its elements to the others
    for (int k = 1; k < n_lanes && pthread_create(&threads[k], NULL, gg_lane_run, &lanes[k]) == 0; k++) {
        started++;
    }
    gg_lane_run(&lanes[0]);
    for (int k = 1; k < started; k++) {
        pthread_join(threads[k], NULL);
    }
    for (int k = 0; k < n_lanes; k++) {
        busy[k] = lanes[k].busy;
    }
    return atomic_load(&job.status);
}

// A param's values in logical order, and back: one copy where it is contiguous. Element by
// element (a call and gg_offset's divisions each) a 1M-element param took tens of ms per call.
static void gg_get_values(const struct ggml_tensor * param, float * out) {
    const int64_t n = ggml_nelements(param);
    if (ggml_is_contiguous(param)) {
        ggml_backend_tensor_get(param, out, 0, n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        ggml_backend_tensor_get(param, &out[i], gg_offset(param, i), sizeof(float));
    }
}

static void gg_set_values(struct ggml_tensor * param, const float * values) {
    const int64_t n = ggml_nelements(param);
    if (ggml_is_contiguous(param)) {
        ggml_backend_tensor_set(param, values, 0, n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        ggml_backend_tensor_set(param, &values[i], gg_offset(param, i), sizeof(float));
    }
}

// write x0 + scale*u into param (through its strides)
static void gg_write_shifted(struct ggml_tensor * param, const float * x0, const float * u, float scale, float * tmp) {
    const int64_t n = ggml_nelements(param);
    for (int64_t i = 0; i < n; i++) tmp[i] = x0[i] + scale * u[i];
    gg_set_values(param, tmp);
}

int gg_directional(struct gg_session * s, struct ggml_cgraph * gf, struct ggml_tensor * param,
                   struct ggml_tensor * loss, const float * dirs, int n_dirs, float h,
                   double * d_h, double * d_half) {
    const int64_t n = ggml_nelements(param);
    float * x0 = malloc(n * sizeof(float));
    float * tmp = malloc(n * sizeof(float));
    gg_get_values(param, x0);
    int st = 0;
    const float scales[4] = { h, -h, 0.5f * h, -0.5f * h };
    for (int k = 0; k < n_dirs && !st; k++) {
        const float * u = dirs + (size_t) k * n;
        double f[4] = {0, 0, 0, 0};
        const int n_points = d_half ? 4 : 2;
        for (int p = 0; p < n_points && !st; p++) {
            gg_write_shifted(param, x0, u, scales[p], tmp);
            st = gg_forward(s, gf);
            f[p] = gg_read_scalar(loss);
        }
        d_h[k] = (f[0] - f[1]) / (2.0 * (double) h);
        if (d_half) d_half[k] = (f[2] - f[3]) / (double) h;
    }
    gg_set_values(param, x0);
    free(x0);
    free(tmp);
    return st;
}
