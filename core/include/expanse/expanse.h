/* expanse: large-state linear attention (power attention, gated chunked linear attention).
 *
 * The C ABI of libexpanse.so. Every function returns an expanse_status; on failure the text of the
 * error, naming the offending argument, is available from expanse_last_error() on the same thread.
 * No exception crosses this boundary. The functions computed are defined in docs/spec.md.
 *
 * Typical use:
 *   expanse_context* ctx;
 *   expanse_context_create("reference", 0, &ctx);          // NULL name: $EXPANSE_BACKEND or "reference"
 *   expanse_power_attention_args a; expanse_power_attention_args_init(&a);
 *   a.q = &q; a.k = &k; a.v = &v; a.o = &o; a.p = 2;
 *   if (expanse_power_attention(ctx, &a) != EXPANSE_OK) fprintf(stderr, "%s\n", expanse_last_error());
 *   expanse_context_destroy(ctx);
 */
#ifndef EXPANSE_EXPANSE_H
#define EXPANSE_EXPANSE_H

#include <stddef.h>
#include <stdint.h>

#include "expanse/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- status and errors */

typedef enum expanse_status {
  EXPANSE_OK = 0,
  EXPANSE_ERROR_INVALID_ARGUMENT = 1, /* bad shape, dtype, rank, stride, null pointer, ... */
  EXPANSE_ERROR_UNSUPPORTED = 2,      /* valid, but the chosen backend does not implement it */
  EXPANSE_ERROR_BACKEND = 3,          /* backend missing, failed to load, or has no device */
  EXPANSE_ERROR_OUT_OF_MEMORY = 4,
  EXPANSE_ERROR_WORKSPACE = 5,        /* the workspace given is smaller than required */
  EXPANSE_ERROR_INTERNAL = 6,         /* a failure inside a backend (kernel launch, driver, ...) */
} expanse_status;

/* Text of the last error on the calling thread ("" if none). Valid until the next call. */
EXPANSE_API const char* expanse_last_error(void);
EXPANSE_API const char* expanse_status_name(expanse_status status);
EXPANSE_API const char* expanse_version(void); /* "MAJOR.MINOR.PATCH" */

/* ---------------------------------------------------------------- tensors (DLPack-like) */

typedef enum expanse_dtype {
  EXPANSE_F16 = 0,
  EXPANSE_BF16 = 1,
  EXPANSE_F32 = 2,
  EXPANSE_F64 = 3,
} expanse_dtype;

/* Device types use DLPack's codes so that framework tensors map one to one. */
typedef enum expanse_device_type {
  EXPANSE_DEVICE_CPU = 1,  /* kDLCPU */
  EXPANSE_DEVICE_CUDA = 2, /* kDLCUDA */
  EXPANSE_DEVICE_ROCM = 10 /* kDLROCM */
} expanse_device_type;

#define EXPANSE_MAX_DIMS 8

/* A non-owning view of a strided tensor. Strides are in elements (not bytes), like DLPack. */
typedef struct expanse_tensor {
  void* data;
  int32_t dtype;       /* expanse_dtype */
  int32_t device_type; /* expanse_device_type */
  int32_t device_id;
  int32_t ndim;
  int64_t shape[EXPANSE_MAX_DIMS];
  int64_t strides[EXPANSE_MAX_DIMS];
} expanse_tensor;

/* Fills *t as a contiguous (row-major) tensor. Returns EXPANSE_ERROR_INVALID_ARGUMENT on bad ndim. */
EXPANSE_API expanse_status expanse_tensor_make(expanse_tensor* t, void* data, expanse_dtype dtype,
                                               int32_t ndim, const int64_t* shape,
                                               expanse_device_type device_type, int32_t device_id);
EXPANSE_API size_t expanse_dtype_size(expanse_dtype dtype); /* 0 for an unknown dtype */
EXPANSE_API const char* expanse_dtype_name(expanse_dtype dtype);

/* ---------------------------------------------------------------- feature-map layouts */

typedef enum expanse_layout_kind {
  EXPANSE_LAYOUT_SYMPOW = 0, /* exact symmetric power, D = C(d+p-1, p) */
  EXPANSE_LAYOUT_TILED = 1,  /* tensor-core friendly blocks of d_tile^p, needs d % d_tile == 0 */
  EXPANSE_LAYOUT_TENSOR = 2, /* all d^p products */
} expanse_layout_kind;

typedef struct expanse_layout {
  int32_t kind;   /* expanse_layout_kind */
  int32_t d_tile; /* only for EXPANSE_LAYOUT_TILED */
} expanse_layout;

/* Expanded dimension D of phi for degree p, head dim d and a layout. */
EXPANSE_API expanse_status expanse_expanded_dim(int32_t p, int64_t d, expanse_layout layout,
                                                int64_t* D);

/* ---------------------------------------------------------------- operations (docs/spec.md) */

typedef enum expanse_op_kind {
  EXPANSE_OP_SYMPOW_EXPAND = 0,
  EXPANSE_OP_UPDATE_STATE = 1,
  EXPANSE_OP_DISCUMSUM = 2,
  EXPANSE_OP_QUERY_STATE = 3,
  EXPANSE_OP_CHUNK_ATTENTION = 4,
  EXPANSE_OP_POWER_ATTENTION = 5,
  EXPANSE_OP_POWER_ATTENTION_STEP = 6,
  EXPANSE_OP_POWER_ATTENTION_BACKWARD = 7,
  EXPANSE_OP_UPDATE_STATE_BACKWARD = 8,
  EXPANSE_OP_DISCUMSUM_BACKWARD = 9,
  EXPANSE_OP_QUERY_STATE_BACKWARD = 10,
  EXPANSE_OP_CHUNK_ATTENTION_BACKWARD = 11,
  EXPANSE_OP_SEQUENCE_STATE = 12,
  EXPANSE_OP_COUNT = 13
} expanse_op_kind;

/* Every operation once, as X(name, NAME): its kind is EXPANSE_OP_<NAME>, its arguments
 * expanse_<name>_args (with expanse_<name>_args_init), its function expanse_<name>. Code that does a
 * thing for each operation expands this list instead of spelling the operations out. */
#define EXPANSE_OPERATIONS(X)                \
  X(sympow_expand, SYMPOW_EXPAND)            \
  X(update_state, UPDATE_STATE)              \
  X(discumsum, DISCUMSUM)                    \
  X(query_state, QUERY_STATE)                \
  X(chunk_attention, CHUNK_ATTENTION)        \
  X(power_attention, POWER_ATTENTION)        \
  X(power_attention_step, POWER_ATTENTION_STEP) \
  X(power_attention_backward, POWER_ATTENTION_BACKWARD) \
  X(update_state_backward, UPDATE_STATE_BACKWARD)       \
  X(discumsum_backward, DISCUMSUM_BACKWARD)             \
  X(query_state_backward, QUERY_STATE_BACKWARD)         \
  X(chunk_attention_backward, CHUNK_ATTENTION_BACKWARD) \
  X(sequence_state, SEQUENCE_STATE)

/* "power_attention", ...; "unknown" for a code that is no operation. */
EXPANSE_API const char* expanse_op_name(expanse_op_kind op);
/* The operation named `name` (as expanse_op_name spells it); EXPANSE_ERROR_INVALID_ARGUMENT, listing
 * the names, for any other. */
EXPANSE_API expanse_status expanse_op_from_name(const char* name, expanse_op_kind* op);

/* Each operation's arguments, as tables (core/src/op_table.cpp declares them, once): the fields of
 * its *_args struct that hold tensors, and those that hold parameters, in declaration order. Error
 * messages name arguments by these names; validation, the CLI (its file and option names), the
 * Python package, the test harness and the fuzzers walk the tables instead of spelling out every
 * operation. */
typedef enum expanse_arg_role {
  EXPANSE_ARG_INPUT = 0,  /* read only (const expanse_tensor*) */
  EXPANSE_ARG_OUTPUT = 1, /* written (expanse_tensor*) */
  EXPANSE_ARG_IN_OUT = 2, /* read and updated in place (power_attention_step's S and z) */
} expanse_arg_role;

typedef struct expanse_tensor_arg_info {
  const char* name; /* the struct field's name */
  size_t offset;    /* offsetof(the op's *_args struct, that field): a pointer to an expanse_tensor */
  int32_t role;     /* expanse_arg_role */
  int32_t required; /* 1: must not be NULL. 0: optional (some are needed with other arguments, e.g.
                       z with normalize=1; validation says which) */
  /* The shape rule: one symbol per dimension, separated by spaces. Sizes: b batch, t tokens, hq
   * query heads, h key/value heads, d key dim, e value dim, D the expanded dim of phi (for p, d and
   * layout), n chunks (for t and chunk_size), "n+1", "t?" (power_attention_step's token axis: t, which
   * its tensors may omit when t = 1), "..." any number of dimensions (the same wherever it appears in
   * one op). Every tensor of a call must agree on every symbol. */
  const char* dims;
  /* The dtype rule: "float" (f16, bf16, f32 or f64), "f32|f64", "=NAME" (the dtype of tensor NAME)
   * or "=NAME|f64" (NAME's dtype, or f64: the outputs the reference writes as an oracle). */
  const char* dtypes;
} expanse_tensor_arg_info;

/* Sets *args to op's table and returns its length; -1 (and *args = NULL) for an unknown op. */
EXPANSE_API int32_t expanse_op_tensor_args(expanse_op_kind op, const expanse_tensor_arg_info** args);
/* sizeof the op's *_args struct; 0 for an unknown op. */
EXPANSE_API size_t expanse_op_args_size(expanse_op_kind op);
/* expanse_<name>_args_init for the op of kind `op`: args points to expanse_op_args_size(op) bytes. */
EXPANSE_API expanse_status expanse_op_args_init(expanse_op_kind op, void* args);

typedef enum expanse_param_type {
  EXPANSE_PARAM_INT32 = 0,  /* int32_t: p, normalize (0 or 1) */
  EXPANSE_PARAM_INT64 = 1,  /* int64_t: chunk_size */
  EXPANSE_PARAM_DOUBLE = 2, /* double: scale */
  EXPANSE_PARAM_LAYOUT = 3, /* expanse_layout */
} expanse_param_type;

typedef struct expanse_param_info {
  const char* name;     /* the struct field's name */
  size_t offset;        /* offsetof(the op's *_args struct, that field) */
  int32_t type;         /* expanse_param_type */
  double default_value; /* what expanse_<name>_args_init sets (a layout: its kind, d_tile 0) */
  const char* help;     /* one line: what it means and which values it takes */
} expanse_param_info;

/* Sets *params to op's parameter table and returns its length; -1 for an unknown op. */
EXPANSE_API int32_t expanse_op_params(expanse_op_kind op, const expanse_param_info** params);

/* The shape of an output (or in-place) tensor of `op` for the inputs and parameters in args, by the
 * table's shape rule: `arg` is its index in expanse_op_tensor_args. The inputs are validated as
 * expanse_run would (except their device and data), outputs may be NULL. Writes its rank to *ndim,
 * its sizes to shape[0..*ndim) (room for EXPANSE_MAX_DIMS) and, when dtype is not NULL, the dtype
 * the library writes by default (the input's for token outputs, f32 for states and gates; f64
 * throughout for f64 inputs). */
EXPANSE_API expanse_status expanse_output_shape(expanse_op_kind op, const void* args, int32_t arg, int32_t* ndim,
                                                int64_t* shape, int32_t* dtype);

/* Every *_args struct starts with a tensor (backends find the call's device there). Optional
 * tensors are NULL when absent. Token tensors are [b,t,heads,dim]. Every *_args struct has
 * an _init function that sets the defaults; always call it first. */

/* phi(x): x [..., d] -> out [..., D]; out has x's dtype (or f64). p in 1..6. */
typedef struct expanse_sympow_expand_args {
  const expanse_tensor* x;
  expanse_tensor* out;
  int32_t p;
  expanse_layout layout;
} expanse_sympow_expand_args;

/* Chunk states: S_loc [b,n,h,D,e], z_loc [b,n,h,D] (f32 or f64; z_loc may be NULL). c >= 1. */
typedef struct expanse_update_state_args {
  const expanse_tensor* k;     /* [b,t,h,d] */
  const expanse_tensor* v;     /* [b,t,h,e] */
  const expanse_tensor* log_g; /* [b,t,h] f32/f64, optional */
  expanse_tensor* S;           /* [b,n,h,D,e] */
  expanse_tensor* z;           /* [b,n,h,D], optional */
  int32_t p;
  int64_t chunk_size;
  expanse_layout layout;
} expanse_update_state_args;

/* Y_0 = Y_init (0 if NULL), Y_{m+1} = exp(A_m) Y_m + X_m. X [b,n,h,...], A [b,n,h], Y [b,n+1,h,...]. */
typedef struct expanse_discumsum_args {
  const expanse_tensor* X;
  const expanse_tensor* A;      /* f32/f64 */
  const expanse_tensor* Y_init; /* [b,h,...], optional */
  expanse_tensor* Y;
} expanse_discumsum_args;

/* The state a sequence leaves when it starts from zero, and its total log decay (context parallelism:
 * what each rank's piece contributes, docs/spec.md):
 *   S = sum_j exp(G_t - G_j) phi(k_j) v_j^T,   z = sum_j exp(G_t - G_j) phi(k_j),   A = G_t
 * (G the cumulative sum of log_g; A = -inf where a reset occurs, 0 without log_g). Computed by chunks
 * of chunk_size tokens (update_state and discumsum). S [b,h,D,e], z [b,h,D] and A [b,h]; z and A
 * optional. */
typedef struct expanse_sequence_state_args {
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g; /* optional */
  expanse_tensor* S;
  expanse_tensor* z; /* optional */
  expanse_tensor* A; /* optional */
  int32_t p;
  int64_t chunk_size;
  expanse_layout layout;
} expanse_sequence_state_args;

/* o_i = phi(scale q_i)^T S_m exp(Gc_i) [+ intra numerator] [/ (... z ... + intra denominator)].
 * S [b,n,h,D,e] and z [b,n,h,D] are the states entering each chunk (discumsum's Y[:, :n]).
 * The intra-chunk result (y,l,rowmax) of chunk_attention is optional; without it only the
 * inter-chunk term is returned. normalize needs z (and l when intra is given) and an even p. */
typedef struct expanse_query_state_args {
  const expanse_tensor* q;      /* [b,t,hq,d] */
  const expanse_tensor* S;      /* [b,n,h,D,e] */
  const expanse_tensor* z;      /* [b,n,h,D], needed when normalize */
  const expanse_tensor* log_g;  /* [b,t,h], optional */
  const expanse_tensor* y;      /* [b,t,hq,e], optional intra-chunk numerator */
  const expanse_tensor* l;      /* [b,t,hq], with y */
  const expanse_tensor* rowmax; /* [b,t,hq], with y */
  expanse_tensor* o;            /* [b,t,hq,e], q's dtype (or f64) */
  int32_t p;
  double scale; /* 0 means the default 1/sqrt(d) */
  int64_t chunk_size;
  int32_t normalize;
  expanse_layout layout;
} expanse_query_state_args;

/* Stabilized causal intra-chunk attention: true numerator y*exp(rowmax), denominator l*exp(rowmax).
 * chunk_size 0 means one chunk spanning the whole sequence (quadratic attention). */
typedef struct expanse_chunk_attention_args {
  const expanse_tensor* q;     /* [b,t,hq,d] */
  const expanse_tensor* k;     /* [b,t,h,d] */
  const expanse_tensor* v;     /* [b,t,h,e] */
  const expanse_tensor* log_g; /* [b,t,h], optional */
  expanse_tensor* y;           /* [b,t,hq,e] f32/f64 */
  expanse_tensor* l;           /* [b,t,hq] f32/f64 */
  expanse_tensor* rowmax;      /* [b,t,hq] f32/f64 */
  int32_t p;
  double scale;
  int64_t chunk_size;
} expanse_chunk_attention_args;

/* chunk_size of power_attention: the default (set by expanse_power_attention_args_init). The
 * context's backend picks the form and the chunk size by the problem's shape (the cuda backend by
 * measurements on the H100, docs/performance.md); a backend without its own rule uses
 * expanse_auto_chunk_size(t). An explicit chunk size always wins. */
#define EXPANSE_CHUNK_AUTO (-1)
/* The rule for backends without their own: 0 (the quadratic form) up to t = 4096, else 1024. */
EXPANSE_API int64_t expanse_auto_chunk_size(int64_t t);

/* Gated power attention. chunk_size: EXPANSE_CHUNK_AUTO (the default) lets the backend choose, 0
 * means the quadratic form, c >= 1 the chunked algorithm with chunks of c tokens (a chunk longer
 * than the sequence is one chunk). log_g = -inf at a token is a reset: the state before it
 * contributes nothing to that token and the ones after (docs/spec.md). initial_S/initial_z
 * [b,h,D,e]/[b,h,D] and final_S/final_z (written when non-NULL) use `layout`. */
typedef struct expanse_power_attention_args {
  const expanse_tensor* q;
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g;
  const expanse_tensor* initial_S;
  const expanse_tensor* initial_z;
  expanse_tensor* o;       /* [b,t,hq,e], v's dtype (or f64) */
  expanse_tensor* final_S; /* optional */
  expanse_tensor* final_z; /* optional; needs final_S */
  int32_t p;
  double scale;
  int64_t chunk_size;
  int32_t normalize;
  expanse_layout layout;
} expanse_power_attention_args;

/* A decoding step of t new tokens: q [b,t,hq,d], k [b,t,h,d], v [b,t,h,e], log_g [b,t,h] (for one token
 * also without the token axis: q [b,hq,d], ...); S [b,h,D,e] and z [b,h,D] are updated in place, token
 * by token (S <- g S + phi(k) v^T), and each token's o = phi(scale q)^T S [/ phi(scale q)^T z] with the
 * state after it: the same as power_attention with S, z as initial and final state. t > 1 serves
 * speculative decoding; t = 0 leaves the state as it is. */
typedef struct expanse_power_attention_step_args {
  const expanse_tensor* q;
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g;
  expanse_tensor* S;
  expanse_tensor* z; /* needed when normalize */
  expanse_tensor* o; /* [b,t,hq,e] (without the token axis where q has none) */
  int32_t p;
  double scale;
  int32_t normalize;
  expanse_layout layout;
} expanse_power_attention_step_args;

/* The gradients of power_attention (docs/spec.md "Gradients"): of the loss
 * L = sum dout . o + <dfinal_S, final_S> + <dfinal_z, final_z> with respect to every input, for the
 * forward's inputs and parameters (the same p, scale, normalize and layout; chunk_size only picks the
 * form, as in the forward). The forward saves nothing for it but its output o, which normalize=1
 * needs; the states are recomputed. An absent cotangent is zero; an absent gradient output is not
 * computed. */
typedef struct expanse_power_attention_backward_args {
  const expanse_tensor* q;
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g;
  const expanse_tensor* initial_S;
  const expanse_tensor* initial_z;
  const expanse_tensor* o;        /* the forward's output [b,t,hq,e]; needed when normalize */
  const expanse_tensor* dout;     /* dL/do [b,t,hq,e] */
  const expanse_tensor* dfinal_S; /* optional: dL/dfinal_S [b,h,D,e] */
  const expanse_tensor* dfinal_z; /* optional: dL/dfinal_z [b,h,D] */
  expanse_tensor* dq;             /* [b,t,hq,d], q's dtype */
  expanse_tensor* dk;             /* [b,t,h,d] */
  expanse_tensor* dv;             /* [b,t,h,e] */
  expanse_tensor* dlog_g;         /* optional (needs log_g): [b,t,h], f32 */
  expanse_tensor* dinitial_S;     /* optional (needs initial_S) */
  expanse_tensor* dinitial_z;     /* optional (needs initial_z) */
  int32_t p;
  double scale;
  int64_t chunk_size;
  int32_t normalize;
  expanse_layout layout;
} expanse_power_attention_backward_args;

/* The gradients of the core operations (docs/spec.md "Gradients"), for users who compose them: each
 * takes its forward's inputs and parameters and the cotangents of its outputs (d<output>), and
 * returns d<input> for its differentiable inputs. */
typedef struct expanse_update_state_backward_args {
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g; /* optional */
  const expanse_tensor* dS;    /* [b,n,h,D,e] */
  const expanse_tensor* dz;    /* [b,n,h,D], optional */
  expanse_tensor* dk;
  expanse_tensor* dv;
  expanse_tensor* dlog_g;      /* optional (needs log_g) */
  int32_t p;
  int64_t chunk_size;
  expanse_layout layout;
} expanse_update_state_backward_args;

typedef struct expanse_discumsum_backward_args {
  const expanse_tensor* X;
  const expanse_tensor* A;
  const expanse_tensor* Y_init; /* optional */
  const expanse_tensor* dY;     /* [b,n+1,h,...] */
  expanse_tensor* dX;           /* [b,n,h,...] */
  expanse_tensor* dA;           /* optional, [b,n,h] */
  expanse_tensor* dY_init;      /* optional (needs Y_init) */
} expanse_discumsum_backward_args;

/* rowmax is a stabilizer: no gradient flows through it (chunk_attention_backward holds it fixed
 * likewise), so the two backwards compose to the gradient of the combined output. */
typedef struct expanse_query_state_backward_args {
  const expanse_tensor* q;
  const expanse_tensor* S;
  const expanse_tensor* z;      /* needed when normalize */
  const expanse_tensor* log_g;  /* optional */
  const expanse_tensor* y;      /* optional intra-chunk result, with l and rowmax */
  const expanse_tensor* l;
  const expanse_tensor* rowmax;
  const expanse_tensor* o;      /* the forward's output; needed when normalize */
  const expanse_tensor* dout;
  expanse_tensor* dq;
  expanse_tensor* dS;
  expanse_tensor* dz;           /* optional (needs z) */
  expanse_tensor* dlog_g;       /* optional (needs log_g) */
  expanse_tensor* dy;           /* optional (needs y) */
  expanse_tensor* dl;           /* optional (needs l) */
  int32_t p;
  double scale;
  int64_t chunk_size;
  int32_t normalize;
  expanse_layout layout;
} expanse_query_state_backward_args;

/* The gradients of y and l with rowmax held at the forward's value (given). */
typedef struct expanse_chunk_attention_backward_args {
  const expanse_tensor* q;
  const expanse_tensor* k;
  const expanse_tensor* v;
  const expanse_tensor* log_g;  /* optional */
  const expanse_tensor* rowmax; /* the forward's */
  const expanse_tensor* dy;
  const expanse_tensor* dl;     /* optional */
  expanse_tensor* dq;
  expanse_tensor* dk;
  expanse_tensor* dv;
  expanse_tensor* dlog_g;       /* optional (needs log_g) */
  int32_t p;
  double scale;
  int64_t chunk_size;
} expanse_chunk_attention_backward_args;

EXPANSE_API void expanse_sympow_expand_args_init(expanse_sympow_expand_args* a);
EXPANSE_API void expanse_update_state_args_init(expanse_update_state_args* a);
EXPANSE_API void expanse_discumsum_args_init(expanse_discumsum_args* a);
EXPANSE_API void expanse_query_state_args_init(expanse_query_state_args* a);
EXPANSE_API void expanse_chunk_attention_args_init(expanse_chunk_attention_args* a);
EXPANSE_API void expanse_power_attention_args_init(expanse_power_attention_args* a);
EXPANSE_API void expanse_power_attention_step_args_init(expanse_power_attention_step_args* a);
EXPANSE_API void expanse_power_attention_backward_args_init(expanse_power_attention_backward_args* a);
EXPANSE_API void expanse_update_state_backward_args_init(expanse_update_state_backward_args* a);
EXPANSE_API void expanse_discumsum_backward_args_init(expanse_discumsum_backward_args* a);
EXPANSE_API void expanse_query_state_backward_args_init(expanse_query_state_backward_args* a);
EXPANSE_API void expanse_chunk_attention_backward_args_init(expanse_chunk_attention_backward_args* a);
EXPANSE_API void expanse_sequence_state_args_init(expanse_sequence_state_args* a);

/* ---------------------------------------------------------------- backends and devices */

typedef struct expanse_device_info {
  char name[128];
  int32_t device_type; /* expanse_device_type */
  int32_t device_id;
  int32_t compute_major, compute_minor; /* 0 where it does not apply */
  int32_t multiprocessors;              /* SMs / CUs / cores */
  uint64_t memory_bytes;
} expanse_device_info;

typedef struct expanse_backend_info {
  char name[64];
  char path[512];    /* the module's file ("" for the built-in reference) */
  int32_t available; /* 1: loaded and has at least one device */
  char reason[512];  /* why it is not available ("" when it is) */
  int32_t device_count;
  uint32_t abi_version;
} expanse_backend_info;

/* Backends known to the registry (loaded or failed), in discovery order; the reference is first.
 * Plugins are modules libexpanse-<name>.so found beside libexpanse.so and in the directories of
 * $EXPANSE_BACKEND_PATH (colon-separated). */
EXPANSE_API int32_t expanse_backend_count(void);
EXPANSE_API expanse_status expanse_backend_get_info(int32_t index, expanse_backend_info* info);
EXPANSE_API expanse_status expanse_backend_device_info(const char* backend, int32_t device,
                                                       expanse_device_info* info);
/* The default backend name: $EXPANSE_BACKEND if set, else "reference". */
EXPANSE_API const char* expanse_default_backend(void);

/* ---------------------------------------------------------------- contexts */

typedef struct expanse_context expanse_context;

/* A context binds a backend, a device, a stream and a workspace. backend NULL or "" selects
 * expanse_default_backend(). Not thread-safe: use one context per thread. */
EXPANSE_API expanse_status expanse_context_create(const char* backend, int32_t device,
                                                  expanse_context** ctx);
EXPANSE_API void expanse_context_destroy(expanse_context* ctx);
EXPANSE_API const char* expanse_context_backend(const expanse_context* ctx);
EXPANSE_API int32_t expanse_context_device_type(const expanse_context* ctx);
/* The stream operations run on (cudaStream_t / hipStream_t; NULL: the default stream). */
EXPANSE_API expanse_status expanse_context_set_stream(expanse_context* ctx, void* stream);
/* Caller-owned device memory the operations may use as scratch; see expanse_workspace_size. */
EXPANSE_API expanse_status expanse_context_set_workspace(expanse_context* ctx, void* workspace,
                                                         size_t bytes);
/* Where a call's workspace comes from when the context's (expanse_context_set_workspace) is too
 * small: allocate(user, bytes) returns device memory on the context's device that stays valid until
 * the operation has run on the context's stream (a framework's stream-ordered caching allocator, as
 * PyTorch's), or NULL when it cannot (EXPANSE_ERROR_OUT_OF_MEMORY). With one, a caller runs an
 * operation with one call (one validation) and no expanse_workspace_size first. NULL: no allocator
 * (the default). */
typedef void* (*expanse_allocate_fn)(void* user, size_t bytes);
EXPANSE_API expanse_status expanse_context_set_allocator(expanse_context* ctx, expanse_allocate_fn allocate,
                                                         void* user);
/* Opt-in check of the inputs' values (off by default): before an operation runs, every floating
 * input is scanned, and a NaN or an infinity (other than -inf in log_g or discumsum's A, which is a
 * reset) gives EXPANSE_ERROR_INVALID_ARGUMENT naming the argument and the index of its first
 * non-finite element. Without it, non-finite inputs give non-finite outputs and no error. It reads
 * every input once more; on a GPU it copies the inputs to the host and synchronizes the stream. */
EXPANSE_API expanse_status expanse_context_set_check_finite(expanse_context* ctx, int32_t enabled);

/* Whether the context's backend implements this problem; when not, the reason is written to
 * `reason` (may be NULL) and EXPANSE_ERROR_UNSUPPORTED is returned. Invalid input gives
 * EXPANSE_ERROR_INVALID_ARGUMENT. Reads no tensor's data (so no finite check either): the
 * descriptors alone are validated. */
EXPANSE_API expanse_status expanse_supports(expanse_context* ctx, expanse_op_kind op,
                                            const void* args, char* reason, size_t reason_len);
EXPANSE_API expanse_status expanse_workspace_size(expanse_context* ctx, expanse_op_kind op,
                                                  const void* args, size_t* bytes);
/* The chunk size power_attention runs with for this problem on this context: chunk_size itself when
 * it is >= 0, else the backend's choice (0 means the quadratic form); validates like
 * expanse_power_attention. */
EXPANSE_API expanse_status expanse_resolved_chunk_size(expanse_context* ctx,
                                                       const expanse_power_attention_args* a,
                                                       int64_t* chunk_size);
/* Validates, then runs `op` (args points to the op's *_args struct) on the context's stream. */
EXPANSE_API expanse_status expanse_run(expanse_context* ctx, expanse_op_kind op, const void* args);

EXPANSE_API expanse_status expanse_sympow_expand(expanse_context* ctx, const expanse_sympow_expand_args* a);
EXPANSE_API expanse_status expanse_update_state(expanse_context* ctx, const expanse_update_state_args* a);
EXPANSE_API expanse_status expanse_discumsum(expanse_context* ctx, const expanse_discumsum_args* a);
EXPANSE_API expanse_status expanse_query_state(expanse_context* ctx, const expanse_query_state_args* a);
EXPANSE_API expanse_status expanse_chunk_attention(expanse_context* ctx, const expanse_chunk_attention_args* a);
EXPANSE_API expanse_status expanse_power_attention(expanse_context* ctx, const expanse_power_attention_args* a);
EXPANSE_API expanse_status expanse_power_attention_step(expanse_context* ctx,
                                                        const expanse_power_attention_step_args* a);
EXPANSE_API expanse_status expanse_power_attention_backward(expanse_context* ctx,
                                                            const expanse_power_attention_backward_args* a);
EXPANSE_API expanse_status expanse_update_state_backward(expanse_context* ctx,
                                                         const expanse_update_state_backward_args* a);
EXPANSE_API expanse_status expanse_discumsum_backward(expanse_context* ctx, const expanse_discumsum_backward_args* a);
EXPANSE_API expanse_status expanse_query_state_backward(expanse_context* ctx,
                                                        const expanse_query_state_backward_args* a);
EXPANSE_API expanse_status expanse_chunk_attention_backward(expanse_context* ctx,
                                                            const expanse_chunk_attention_backward_args* a);
EXPANSE_API expanse_status expanse_sequence_state(expanse_context* ctx, const expanse_sequence_state_args* a);

/* ---------------------------------------------------------------- context parallelism (docs/spec.md) */

/* power_attention_backward whose final-state cotangent arrives during the call, for callers that
 * split one sequence themselves (context parallelism: a piece's final-state cotangent comes from the
 * pieces after it, which need this piece's initial-state cotangent first). `a` declares initial_S,
 * dinitial_S and dfinal_S (and, normalized, initial_z, dinitial_z and dfinal_z). The call computes the
 * initial state's cotangent as if dfinal_S and dfinal_z were zero and writes it to dinitial_S and
 * dinitial_z; calls exchange(stream, user) with the context's stream, which must read those and
 * write dfinal_S and dfinal_z, itself or by work it enqueues on that stream; then finishes: every
 * output as expanse_power_attention_backward gives it with that dfinal (dinitial included). The
 * backend's one-pass form where it has one (the CUDA tensor-core backward: the state cotangents are
 * linear in dfinal, which is added to them after their scan); otherwise two backward passes, the first
 * for dinitial. exchange returns 0 on success. A call that fails before the callback does not call it:
 * ranks whose callbacks meet in a collective must treat an error as fatal for the whole group. */
typedef int32_t (*expanse_exchange_fn)(void* stream, void* user);

/* power_attention whose initial state arrives during the call, for the same callers (the state
 * entering a piece comes from the pieces before it, which need this piece's own final state first).
 * `a` declares initial_S and final_S (and, normalized, initial_z and final_z). The call computes the
 * final state of the piece run from zero and writes it to final_S and final_z; calls
 * exchange(stream, user), which must read those and write initial_S and initial_z, itself or by work
 * it enqueues on the stream; then writes o as power_attention gives it from that initial state
 * (final_S and final_z keep the state from zero). The backend's one-pass form where it has one (the
 * GPU backends: the chunk states are linear in the initial state, which is added to them after their
 * scan); otherwise sequence_state, then power_attention. */
EXPANSE_API expanse_status expanse_power_attention_exchange(expanse_context* ctx, const expanse_power_attention_args* a,
                                                            expanse_exchange_fn exchange, void* user);
EXPANSE_API expanse_status expanse_power_attention_backward_exchange(expanse_context* ctx,
                                                                     const expanse_power_attention_backward_args* a,
                                                                     expanse_exchange_fn exchange, void* user);

/* A collective the caller owns: gathers `bytes` bytes from each rank into recv (rank r's at byte
 * r * bytes), ordered on `stream` (the context's stream). Returns 0 on success. The CUDA plugin offers
 * NCCL's as the extra "expanse_nccl_allgather" (user: the ncclComm_t; expanse_backend_proc). */
typedef int32_t (*expanse_allgather_fn)(const void* send, void* recv, size_t bytes, void* stream, void* user);

typedef struct expanse_context_parallel {
  int32_t rank;  /* this rank: it holds the rank-th piece of the sequence */
  int32_t ranks; /* >= 1 */
  expanse_allgather_fn allgather;
  void* user; /* given to allgather */
} expanse_context_parallel;

/* power_attention of one sequence split across ranks, every rank calling it with its piece in `a`
 * (pieces in rank order, any lengths >= 1; the same b, heads, options and chunk size everywhere).
 * o receives this piece's output, equal to one call over the whole sequence; final_S/final_z, where
 * given, the sequence's final state, on every rank. initial_S/initial_z, the sequence's initial state,
 * hold the same values on every rank (or are absent on all). Each rank sends, once, its piece's state
 * from zero and total log decay (sequence_state): D*e + D + 1 values per batch entry and kv head. */
EXPANSE_API expanse_status expanse_context_parallel_power_attention(expanse_context* ctx,
                                                                     const expanse_context_parallel* cp,
                                                                     const expanse_power_attention_args* a);
/* Its gradients, every rank calling it with its piece: o its output, dout its cotangent; dfinal_S /
 * dfinal_z (the cotangent of the sequence's final state) and the initial state hold the same values on
 * every rank. dq, dk, dv, dlog_g receive this piece's gradients; dinitial_S/dinitial_z the initial
 * state's gradient on rank 0 and zeros on the others. Each rank sends its forward exchange again
 * (sequence_state of its piece first) and the cotangent of its entering state, during one
 * expanse_power_attention_backward_exchange of its piece. */
EXPANSE_API expanse_status expanse_context_parallel_power_attention_backward(
    expanse_context* ctx, const expanse_context_parallel* cp, const expanse_power_attention_backward_args* a);

/* The extra named `name` of the context's backend (a function pointer the backend documents), or
 * EXPANSE_ERROR_UNSUPPORTED when it has none by that name. */
EXPANSE_API expanse_status expanse_backend_proc(const expanse_context* ctx, const char* name, void** proc);

/* Memory on the context's device, for callers without a framework (the CLI, tests, C users). */
typedef enum expanse_copy_kind {
  EXPANSE_COPY_HOST_TO_DEVICE = 0,
  EXPANSE_COPY_DEVICE_TO_HOST = 1,
  EXPANSE_COPY_DEVICE_TO_DEVICE = 2,
} expanse_copy_kind;

EXPANSE_API expanse_status expanse_malloc(expanse_context* ctx, size_t bytes, void** ptr);
EXPANSE_API expanse_status expanse_free(expanse_context* ctx, void* ptr);
/* Ordered on the context's stream; call expanse_synchronize before reading host memory. */
EXPANSE_API expanse_status expanse_memcpy(expanse_context* ctx, void* dst, const void* src,
                                          size_t bytes, expanse_copy_kind kind);
EXPANSE_API expanse_status expanse_synchronize(expanse_context* ctx);

/* Device timing: runs body(user) `reps` times on the context's stream, each between a pair of the
 * backend's device events (CUDA events on the cuda backend), and writes each run's milliseconds to
 * ms[0..reps). Returns EXPANSE_ERROR_UNSUPPORTED when the backend has no device timer (the CPU
 * reference: time it with a host clock). Used by `expanse bench`. */
EXPANSE_API expanse_status expanse_time_runs(expanse_context* ctx, void (*body)(void* user), void* user,
                                             int32_t reps, float* ms);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPANSE_EXPANSE_H */
