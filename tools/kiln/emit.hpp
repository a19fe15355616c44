// kiln emit: a program as C++ that loads and runs it through libkiln.
#pragma once

#include <string>

#include "kiln/program_spec.hpp"

namespace kiln {

// C++ that loads and runs the program through libkiln with its steps
// unrolled (kiln emit): a struct with one handle per kernel and a call
// operator taking the inputs and outputs as pointers and the symbols'
// values, checking at each call what Program::run checks (guards, integer
// overflow and division by zero, sizes, i32 ranges). Program names reach
// the C++ only as prefixed identifiers and escaped literals.
std::string emit_program_cpp(const ProgramSpec& spec);

}  // namespace kiln
