// Stand-in: the runtime API (in cuda_runtime.h) is all the emulator has; driver API calls fail to build.
#pragma once
#include <cuda_runtime.h>
