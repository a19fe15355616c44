// The kernel kiln::InputFiller (kiln/fill.hpp) fills a GPU's memory with: its
// compile request (the cuda backend's), for the filler and for a test that
// compiles it without a GPU.
#pragma once

#include <string>

#include "kiln/ext/backend.hpp"

namespace kiln {

// kiln_fill(out, n, seed, dtype, mode, c): elements 0 .. n-1 of the generator
// with `seed`, in the dtype (kiln's DType numbering), then the scale (mode 1)
// or constant (mode 2) c; a grid-stride loop, any grid.
CompileRequest cuda_fill_request();

}  // namespace kiln
