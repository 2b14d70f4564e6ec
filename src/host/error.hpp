// Errors inside twblas are C++ exceptions carrying a status and a message; the C boundary
// (bindings/c) catches them and turns them into a twStatus_t plus twGetErrorMessage() text.
#pragma once

#include <cstdarg>
#include <exception>
#include <string>

#include "twblas/twblas.h"

namespace twblas {

class Error : public std::exception {
  public:
    Error(twStatus_t status, std::string message) : status_(status), message_(std::move(message)) {}
    twStatus_t status() const noexcept { return status_; }
    const char *what() const noexcept override { return message_.c_str(); }

  private:
    twStatus_t status_;
    std::string message_;
};

/// printf-style formatting into a std::string.
std::string format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/// Throws Error(status, formatted message).
[[noreturn]] void fail(twStatus_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace twblas
