// File: internal/exception_text.h
//
// How an exception that is not a distribute::Error reads where the library
// quotes it to other replicas and workers ("Replica 0 failed with ..."). By
// default that is its C++ type and what(). A front end whose exceptions wrap
// its language's own (the Python module: pybind11::error_already_set around
// a KeyError) registers a describer, so that they read as the user wrote
// them ("KeyError: 'missing'"). Not part of the public API.
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace distribute::internal {

// Returns the text for exceptions it knows, nullopt for the others. It may
// be called on any thread, and must not throw.
using ExceptionDescriber = std::optional<std::string> (*)(const std::exception_ptr& e);

// Registers the describer (one per process; nullptr removes it).
void set_exception_describer(ExceptionDescriber describer) noexcept;

}  // namespace distribute::internal
