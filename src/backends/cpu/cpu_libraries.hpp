// The libraries of the cpu backend, one file each (kiln/ext/library.hpp).
#pragma once

#include <memory>

#include "kiln/ext/library.hpp"

namespace kiln {

std::unique_ptr<Library> make_openblas(int threads);  // openblas.cpp

}  // namespace kiln
