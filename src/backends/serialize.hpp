// JSON forms of the stage values, for the disk cache and the worker protocol.
#pragma once

#include <nlohmann/json.hpp>

#include "kiln/backend.hpp"

namespace kiln {

nlohmann::json to_json(const CompileRequest& r);
CompileRequest compile_request_from_json(const nlohmann::json& j);

// Everything but the bytes.
nlohmann::json binary_meta_to_json(const Binary& b);
Binary binary_from_meta_json(const nlohmann::json& j);

}  // namespace kiln
