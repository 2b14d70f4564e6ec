// Catch2's implementation, compiled once for every test program (the slow part of a Catch2
// build), and the session that each program's main() runs: test_main.cpp for the CPU programs,
// cuda_test_main.cpp for the CUDA ones.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "test_main.hpp"

namespace twtest {

int run_catch(int argc, char *argv[], int (*before_cases)(const char *program)) {
    Catch::Session session;
    if (const int rc = session.applyCommandLine(argc, argv)) return rc;
    const Catch::ConfigData &cfg = session.configData();
    const bool runs_cases =
        !(cfg.showHelp || cfg.listTests || cfg.listTestNamesOnly || cfg.listTags || cfg.listReporters);
    if (runs_cases && before_cases)
        if (const int rc = before_cases(argv[0])) return rc;
    return session.run();
}

}  // namespace twtest
