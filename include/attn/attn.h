// attn: the public API in one include.
#pragma once

#include "attn/additive.h"
#include "attn/backward.h"
#include "attn/info.h"
#include "attn/rotary.h"
#include "attn/sdpa.h"
#include "attn/status.h"
#include "attn/tensor.h"
