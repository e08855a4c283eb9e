// libtessera.so's own translation unit: the library is tessera_lib linked whole (the C API is
// src/api/tessera_c.cpp); this file only gives the target a source.
#include "tessera/tessera.h"
