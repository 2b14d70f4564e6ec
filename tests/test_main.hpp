// The Catch2 session of the test programs (catch_impl.cpp), for their main().
#pragma once

namespace twtest {

/// Parses the command line and runs the selected cases, as Catch2's own main() does. When the
/// command line asks to run cases (not to list them or for help), `before_cases` (if any) is
/// called first: a non-zero return ends the program with that code, no case run.
int run_catch(int argc, char *argv[], int (*before_cases)(const char *program) = nullptr);

}  // namespace twtest
