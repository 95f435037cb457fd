/* Tandem: distributed deep-learning training runtime. Include this header
 * for the whole public API. */
#ifndef TANDEM_H
#define TANDEM_H

#include "base.h"
#include "device.h"
#include "comm.h"
#include "nn.h"
#include "obs.h"
#include "parallel.h"
#include "train.h"
#include "elastic.h"

#endif
