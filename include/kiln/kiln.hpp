// Everything an application uses, in one include. The extension tier (new
// backends, search strategies) is under kiln/ext/.
#pragma once

#include "kiln/args.hpp"
#include "kiln/artifact.hpp"
#include "kiln/device_args.hpp"
#include "kiln/error.hpp"
#include "kiln/fill.hpp"
#include "kiln/kernel.hpp"
#include "kiln/memory_plan.hpp"
#include "kiln/multi_kernel.hpp"
#include "kiln/options.hpp"
#include "kiln/program.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"
#include "kiln/tuning.hpp"
#include "kiln/version.hpp"
