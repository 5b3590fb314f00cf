// lumos::core alone: no simdjson, no zlib.
#include <lumos/core/time.hpp>

int main() { return lumos::parse_microseconds("1.5").value == 1500 ? 0 : 1; }
