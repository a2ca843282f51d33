/* The plugin ABI: what a backend module (libexpanse-<name>.so) exports and the core calls.
 *
 * A module exports one C symbol, `expanse_backend_entry`, returning a pointer to a static
 * expanse_backend table. The core checks abi_version before calling anything else, then init(), and
 * afterwards calls the other functions only with inputs it has already validated against docs/spec.md:
 * every expanse_op carries the sizes the core derived (expanse_problem), so a backend only decides
 * whether it implements the problem and runs it. No C++ type or exception crosses this boundary;
 * errors come back as a status plus text written into a caller buffer.
 */
#ifndef EXPANSE_BACKEND_H
#define EXPANSE_BACKEND_H

#include "expanse/expanse.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bump on any change of the structs below. A module built for another version is refused. */
#define EXPANSE_BACKEND_ABI_VERSION 2u
#define EXPANSE_BACKEND_ENTRY_SYMBOL "expanse_backend_entry"

/* The sizes and flags of a validated problem. Fields that do not apply to an op are 0. */
typedef struct expanse_problem {
  int64_t b, t, hq, h, d, e; /* batch, tokens, query heads, kv heads, key dim, value dim */
  int64_t D;                 /* expanded dim of phi for p, d and layout */
  int64_t c, n;              /* chunk size and number of chunks (c = t, n = 1 for the quadratic form) */
  int32_t p;
  expanse_layout layout;
  double scale;              /* resolved (the default 1/sqrt(d) already applied) */
  int32_t input_dtype;       /* dtype of q/k/v (x for sympow_expand, X for discumsum) */
  int32_t output_dtype;      /* dtype of the main output */
  int32_t state_dtype;       /* dtype of S/z tensors where present */
  int32_t gated, normalize, has_initial_state, want_final_state, has_intra;
  int64_t rows;              /* sympow_expand: number of vectors; discumsum: elements per (b,n,h) */
} expanse_problem;

/* Words of an op's memo (below). */
#define EXPANSE_OP_MEMO_WORDS 4

typedef struct expanse_op {
  expanse_op_kind kind;
  const void* args; /* the public expanse_<op>_args struct of this kind */
  const expanse_problem* problem;
  /* The call's memo: EXPANSE_OP_MEMO_WORDS words that the core zeroes before a call's first backend
   * function and keeps through that call's supports, workspace_size and run, so that a backend
   * decides once per call (which implementation takes the problem) and recalls it after. */
  int64_t* memo;
} expanse_op;

typedef struct expanse_exec {
  int32_t device;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
} expanse_exec;

typedef struct expanse_backend {
  uint32_t abi_version; /* EXPANSE_BACKEND_ABI_VERSION */
  uint32_t struct_size; /* sizeof(expanse_backend) the module was built with */
  const char* name;     /* "cuda", "hip", ... */
  int32_t device_type;  /* expanse_device_type of the memory its operations read and write */

  /* Probe the driver and devices. A non-OK status (with the reason in err) marks the backend
   * unavailable; the core keeps working without it. */
  expanse_status (*init)(char* err, size_t err_len);
  int32_t (*device_count)(void);
  expanse_status (*device_info)(int32_t device, expanse_device_info* info);

  /* EXPANSE_OK or EXPANSE_ERROR_UNSUPPORTED with the reason in `reason`. */
  expanse_status (*supports)(const expanse_op* op, char* reason, size_t reason_len);
  expanse_status (*workspace_size)(const expanse_op* op, size_t* bytes);
  /* Enqueue on exec->stream; never synchronize the device, never allocate device memory (scratch
   * comes from exec->workspace). The CPU reference allocates host temporaries, which is fine. */
  expanse_status (*run)(const expanse_op* op, const expanse_exec* exec, char* err, size_t err_len);

  expanse_status (*memory_alloc)(int32_t device, size_t bytes, void** ptr, char* err, size_t err_len);
  expanse_status (*memory_free)(int32_t device, void* ptr);
  expanse_status (*memory_copy)(int32_t device, void* dst, const void* src, size_t bytes,
                                expanse_copy_kind kind, void* stream, char* err, size_t err_len);
  expanse_status (*synchronize)(int32_t device, void* stream, char* err, size_t err_len);

  /* Optional extras by name (NULL when absent), so the table need not grow for each of them. */
  void* (*get_proc_address)(const char* name);
} expanse_backend;

typedef const expanse_backend* (*expanse_backend_entry_fn)(void);

/* Optional extras a backend may return from get_proc_address: */
/* "expanse_choose_chunk_size": power_attention's chunk size for EXPANSE_CHUNK_AUTO on this backend
 * (0: the quadratic form). The problem has every field set but c and n. */
typedef int64_t (*expanse_choose_chunk_size_fn)(const expanse_problem* problem);
#define EXPANSE_CHOOSE_CHUNK_SIZE_PROC "expanse_choose_chunk_size"
/* The one-pass forms of expanse_power_attention_exchange and expanse_power_attention_backward_exchange
 * (expanse.h), for an op of their kind with the tensors they declare: run() as usual, except that
 * exchange(exec->stream, user) is called once in the middle and what it writes is read only after it
 * returned: the forward's initial_S/initial_z, after final_S/final_z hold the piece's final state from
 * zero; the backward's dfinal_S/dfinal_z, after dinitial_S/dinitial_z hold the initial state's
 * cotangent without dfinal. EXPANSE_ERROR_UNSUPPORTED (reason in err), before any work, where the
 * implementation that takes the problem has no such form: the core then composes other calls. */
typedef expanse_status (*expanse_run_exchanging_fn)(const expanse_op* op, const expanse_exec* exec,
                                                    expanse_exchange_fn exchange, void* user, char* err,
                                                    size_t err_len);
#define EXPANSE_FORWARD_EXCHANGE_PROC "expanse_power_attention_exchange"
#define EXPANSE_BACKWARD_EXCHANGE_PROC "expanse_power_attention_backward_exchange"

#if defined(_WIN32)
#  define EXPANSE_BACKEND_EXPORT __declspec(dllexport)
#else
#  define EXPANSE_BACKEND_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPANSE_BACKEND_H */
