/* Small helpers shared by the collective algorithms. */
#include "comm/comm_impl.h"

#include <string.h>

void comm_copy_if_needed(void *dst, const void *src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  /* memmove: callers may pass overlapping shards (in-place layouts where
   * the user's buffers overlap partially are legal in the API). */
  memmove(dst, src, bytes);
}
