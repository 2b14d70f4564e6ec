#include "objects.hpp"

#include "backend.hpp"

// Out of line so that the unique_ptr members see the complete Backend / FfnState types.
twContext::twContext() = default;
twContext::~twContext() = default;
twFfnDescr::twFfnDescr() = default;
twFfnDescr::~twFfnDescr() = default;
