// Must not compile: an observer without task(i, start, end) given to the replay engine.
#include <lumos/graph/compile.hpp>
#include <lumos/sim/replay.hpp>

struct not_an_observer {
  void begin(std::size_t) {}
};

int main() {
  lumos::graph::compiled_graph g;
  lumos::sim::replay_engine engine;
  not_an_observer o;
  return static_cast<int>(engine.run(g, o));
}
