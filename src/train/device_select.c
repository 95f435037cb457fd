/* Which device a rank trains on (train-gpt --device, config key "device",
 * TANDEM_DEVICE): the one policy the engine adds to the device layer, that
 * "cuda" without an index means cuda:(local rank % visible GPUs). Ranks of a
 * host then spread over its GPUs, and share them round-robin when there are
 * more ranks than GPUs, as on a machine with one GPU and two ranks. */
#include "base/base.h"
#include "tandem/train.h"

#include <string.h>

td_status td_train_device_select(const char *spec, int local_rank, td_device *out) {
  if (!out) return td_error(TD_ERR_INVALID_ARGUMENT, "td_train_device_select: out is NULL");
  const char *from = "the device setting";
  if (!spec || !*spec) {
    spec = td_env_str("TANDEM_DEVICE", "");
    from = "TANDEM_DEVICE";
    if (!*spec) {
      spec = "cpu";
      from = "the default";
    }
  }
  td_device dev;
  td_status st = td_device_parse(spec, &dev);
  if (st != TD_OK) {
    char why[400];
    td_error_copy(why, sizeof why);
    return td_error(st, "%s '%s': %s", from, spec, why);
  }
  /* "cuda" alone (td_device_parse reads it as index 0) takes the rank's share */
  if (dev.kind == TD_DEVICE_CUDA && !strchr(spec, ':')) {
    int n = td_device_count(TD_DEVICE_CUDA);
    if (n > 0) dev.index = (local_rank > 0 ? local_rank : 0) % n;
  }
  st = td_device_open(dev);
  if (st != TD_OK) {
    char why[400], name[16];
    td_error_copy(why, sizeof why);
    return td_error(st, "%s '%s' (local rank %d -> %s): %s", from, spec, local_rank,
                    td_device_name(dev, name, sizeof name), why);
  }
  *out = dev;
  return TD_OK;
}
