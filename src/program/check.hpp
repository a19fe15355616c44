// Checking a program's result against its reference program (Program::check,
// kiln run --check; docs/program.md).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "kiln/program.hpp"

namespace kiln {

// Runs `spec`'s reference (plain) on `inputs` (host copies of the program's
// inputs as the call gave them, in the program's order and dtypes) and
// compares what it computes with `outputs` (host copies of the program's
// outputs); and where an input is state in both programs, what the
// reference left in it with `state` (per program input: host copies of the
// state inputs as the call left them, empty for the others). `symbols`: the
// program's symbols and scalars for the call.
ProgramCheck check_against_reference(Runtime& rt, const ProgramSpec& spec, const std::map<std::string, int64_t>& symbols,
                                     const std::vector<std::vector<std::byte>>& inputs,
                                     const std::vector<std::vector<std::byte>>& outputs,
                                     const std::vector<std::vector<std::byte>>& state);

}  // namespace kiln
