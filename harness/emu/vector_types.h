// Stand-in: everything lives in the emulator's cuda_runtime.h.
#pragma once
#include <cuda_runtime.h>
