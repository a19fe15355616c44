// JSON forms of the stage values, for the disk cache and the worker protocol.
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/ext/backend.hpp"

namespace kiln {

nlohmann::json to_json(const CompileRequest& r);
CompileRequest compile_request_from_json(const nlohmann::json& j);

// Everything but the bytes. Reading metadata that is missing or
// inconsistent throws (never a guessed default).
nlohmann::json binary_meta_to_json(const Binary& b);
Binary binary_from_meta_json(const nlohmann::json& j);
nlohmann::json to_json(const KernelMeta& m);
KernelMeta kernel_meta_from_json(const nlohmann::json& j);

// JSON text of `j`; text that is not valid UTF-8 (a compiler's message, a
// folder's name) is written with U+FFFD in its place, never an exception.
std::string dump_json(const nlohmann::json& j, int indent = -1);

}  // namespace kiln
