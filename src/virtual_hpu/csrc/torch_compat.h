// Where torch's C++ API differs across the supported range (2.6 to 2.15: each Gaudi release's torch and laptops'), one
// definition per difference, named after what changed and when. The sources use these names instead of version checks
// of their own. Intel's builds carry the upstream version they are cut from ("2.6.0a0+git...": minor 6).
#pragma once

#include <torch/version.h>

#define VIRTUAL_HPU_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// 2.7: the accelerator hooks gained isBuilt() and isAvailable(); torch 2.6 asks neither.
#if VIRTUAL_HPU_TORCH_AT_LEAST(2, 7)
#define VIRTUAL_HPU_OVERRIDE_SINCE_2_7 override
#else
#define VIRTUAL_HPU_OVERRIDE_SINCE_2_7
#endif

// 2.7: DeviceGuardImplInterface::getStream and exchangeStream stopped being noexcept. Ours stay noexcept, which
// overrides both declarations.

// 2.8: c10d::Work gained blockCurrentStream(), which a wrapping Work forwards.
#define VIRTUAL_HPU_WORK_BLOCKS_STREAMS VIRTUAL_HPU_TORCH_AT_LEAST(2, 8)

// 2.10: torch registers an autograd fallback for PrivateUse1 (pytorch#165315); before, a backend registers its own, or
// its custom ops and torch's c10d ops find no kernel at AutogradPrivateUse1 ("Could not run ... from the 'Autogradhpu'
// backend").
#define VIRTUAL_HPU_REGISTERS_PRIVATEUSE1_AUTOGRAD_FALLBACK !VIRTUAL_HPU_TORCH_AT_LEAST(2, 10)

// 2.12: the structured kernels' set_output_strided / set_output_raw_strided lost their trailing DimnameList (named
// tensors went); before, an override takes it and hands it on.
#if VIRTUAL_HPU_TORCH_AT_LEAST(2, 12)
#define VIRTUAL_HPU_OUTPUT_NAMES_PARAM
#define VIRTUAL_HPU_OUTPUT_NAMES_ARG
#else
#define VIRTUAL_HPU_OUTPUT_NAMES_PARAM , [[maybe_unused]] at::DimnameList names
#define VIRTUAL_HPU_OUTPUT_NAMES_ARG , names
#endif
