/* The C ABI functions tandem._tandem hands to other extensions (the c10d
 * backend) through the capsule "tandem._tandem._C_API", so that a
 * communicator created by tandem._tandem is driven by the very same copy of
 * the library (libtandem.a is linked into _tandem only). */
#ifndef TANDEM_PY_API_H
#define TANDEM_PY_API_H
#include "tandem/comm.h"

#define TANDEM_PY_API_VERSION 1

typedef struct tandem_py_api {
  int version;
  td_status (*iallreduce)(const void *, void *, size_t, td_dtype, td_op, td_comm *, td_request **);
  td_status (*ireduce)(const void *, void *, size_t, td_dtype, td_op, int, td_comm *, td_request **);
  td_status (*ibroadcast)(void *, size_t, td_dtype, int, td_comm *, td_request **);
  td_status (*ireduce_scatter)(const void *, void *, size_t, td_dtype, td_op, td_comm *, td_request **);
  td_status (*iallgather)(const void *, void *, size_t, td_dtype, td_comm *, td_request **);
  td_status (*ialltoall)(const void *, void *, size_t, td_dtype, td_comm *, td_request **);
  td_status (*ibarrier)(td_comm *, td_request **);
  td_status (*isend)(const void *, size_t, td_dtype, int, td_comm *, td_request **);
  td_status (*irecv)(void *, size_t, td_dtype, int, td_comm *, td_request **);
  td_status (*wait)(td_request *);
  td_status (*test)(td_request *, int *);
  const char *(*last_error)(void);
  const char *(*comm_last_error)(const td_comm *);
  const char *(*status_str)(td_status);
  /* The td_comm of a tandem._tandem.Comm object (NULL and a Python error if
   * it is not one, or shut down). */
  td_comm *(*comm_of)(void *py_comm_object);
} tandem_py_api;

#endif
