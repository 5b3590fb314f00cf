// Explicit pipeline layouts (Megatron's --pipeline-model-parallel-layout): the parser, the layers
// each stage holds under one, and the rules `parallel_config::validate` checks.

#include <lumos/model/flops.hpp>
#include <lumos/model/parallel.hpp>
#include <lumos/model/pipeline_layout.hpp>

#include "config_support.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace layout_test {

using namespace lumos::model;

std::vector<std::int64_t> repeat(std::int64_t first, std::int64_t middle, int times, std::int64_t last) {
  std::vector<std::int64_t> v{first};
  v.insert(v.end(), static_cast<std::size_t>(times), middle);
  v.push_back(last);
  return v;
}

// The message `parse_pipeline_layout(text)` throws ("" when it does not).
std::string parse_error(const std::string& text) {
  try {
    (void)parse_pipeline_layout(text);
  } catch (const lumos::error& e) {
    return e.what();
  }
  return "";
}

}  // namespace layout_test

TEST_CASE("pipeline layout strings expand as Megatron's", "[model][pipeline][layout]") {
  using namespace lumos::model;
  using layout_test::repeat;
  const pipeline_layout a = parse_pipeline_layout("Et*4|(t*4|)*14tL");
  CHECK(a.blocks == repeat(4, 4, 14, 1));
  CHECK(a.mtp == 0);
  CHECK(a.layers() == 61);
  const pipeline_layout b = parse_pipeline_layout("Et|(tt|)*30mL");  // DeepSeek-V3, PP 8 x VP 4 with MTP
  CHECK(b.virtual_stages() == 32);
  CHECK(b.blocks == repeat(1, 2, 30, 1));
  CHECK(b.mtp == 1);
  CHECK(b.layers() == 61);
  CHECK(parse_pipeline_layout("E|t*3|ttL").blocks == std::vector<std::int64_t>{0, 3, 2});
  CHECK(parse_pipeline_layout("E((t|)*2)*2tL").blocks == std::vector<std::int64_t>{1, 1, 1, 1, 1});
  CHECK(parse_pipeline_layout("Et*0|tL").blocks == std::vector<std::int64_t>{0, 1});  // *0 drops the item
  CHECK(parse_pipeline_layout("EtL").blocks == std::vector<std::int64_t>{1});
  // Megatron's string of a layout reads back as the same layout.
  for (const char* text : {"Et*4|(t*4|)*14tL", "Et|(tt|)*30mL", "E|t*3|ttL", "Et*2|t*2mmL"}) {
    INFO(text);
    const pipeline_layout x = parse_pipeline_layout(text);
    const pipeline_layout y = parse_pipeline_layout(x.to_string());
    CHECK(y.blocks == x.blocks);
    CHECK(y.mtp == x.mtp);
  }
}

TEST_CASE("bad pipeline layout strings name the character at fault", "[model][pipeline][layout]") {
  using layout_test::parse_error;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "at character 1: the layout is empty"},
      {"Et*|tL", "at character 4: expected a count after '*'"},
      {"Et*4|(t*4|*14tL", "at character 6: '(' is not closed"},
      {"Et)L", "at character 3: ')' without a matching '('"},
      {"Ex|tL", "at character 2: unexpected 'x'"},
      {"*2EtL", "at character 1: '*' must follow an item or a group"},
      {"E()tL", "at character 2: empty group '()'"},
      {"E(t*99999)*99999L", "expands to more than"},
      {"E" + std::string(100, '(') + "t" + std::string(100, ')') + "L", "at character 66: groups nested more than 64 deep"},
      {"t|tL", "must start with E"},
      {"EtE|tL", "E (the embedding) must come first"},
      {"EtL|t", "L (the loss) must come last"},
      {"Et|t", "must end with L"},
      {"Et||tL", "virtual stage 1 holds nothing"},
      {"Etm|tL", "a transformer layer follows a multi-token-prediction block in virtual stage 1"},
      {"Etm|L", "must all be in the last virtual stage"},
  };
  for (const auto& [text, want] : bad) {
    INFO(text);
    const std::string got = parse_error(text);
    CHECK(got.find("pipeline layout '" + text + "'") == 0);
    CHECK(got.find(want) != std::string::npos);
  }
}

TEST_CASE("an explicit layout sets the layers of each virtual stage and stage", "[model][pipeline][layout]") {
  using namespace lumos::model;
  const transformer m = test::small_gpt(8);
  parallel_config even = test::config(1, 2, 1, 1, 8);
  even.vp = 2;
  // The even split's layout gives what the even split gives.
  parallel_config same = even;
  same.layout = parse_pipeline_layout("Et*2|t*2|t*2|t*2L");
  CHECK_NOTHROW(same.validate(m));
  for (int s = 0; s < 2; ++s) {
    CHECK(same.stage_layers(m, s) == even.stage_layers(m, s));
    for (int c = 0; c < 2; ++c) CHECK(same.chunk_layers(m, s, c) == even.chunk_layers(m, s, c));
  }
  // Virtual stages 0..3 (chunk * pp + stage) hold 3, 2, 2, 1 layers.
  parallel_config uneven = even;
  uneven.layout = parse_pipeline_layout("Et*3|t*2|t*2|tL");
  REQUIRE_NOTHROW(uneven.validate(m));
  CHECK_FALSE(uneven.embedding_loss_in_split(m));
  CHECK(uneven.chunk_layers(m, 0, 0) == 3);
  CHECK(uneven.chunk_layers(m, 1, 0) == 2);
  CHECK(uneven.chunk_layers(m, 0, 1) == 2);
  CHECK(uneven.chunk_layers(m, 1, 1) == 1);
  CHECK(uneven.stage_layers(m, 0) == 5);
  CHECK(uneven.stage_layers(m, 1) == 3);
  CHECK(uneven.layers_per_stage(m) == 5);  // the most a stage holds
  CHECK(uneven.layers_per_chunk(m) == 3);
  CHECK(uneven.first_layer(m, 2) == 5);
  CHECK(uneven.first_layer(m, 3) == 7);
  // Stage 0 holds one layer more than under the even split, stage 1 one fewer.
  const std::int64_t layer = layer_parameters_per_rank(m, 1);
  CHECK(stage_parameters_per_rank(m, uneven, 0) - stage_parameters_per_rank(m, even, 0) == layer);
  CHECK(stage_parameters_per_rank(m, even, 1) - stage_parameters_per_rank(m, uneven, 1) == layer);
}

TEST_CASE("validate checks an explicit layout against pp x vp and the model", "[model][pipeline][layout]") {
  using namespace lumos::model;
  const transformer m = test::small_gpt(8);
  parallel_config p = test::config(1, 2, 1, 1, 8);
  p.layout = parse_pipeline_layout("Et*3|t*2|t*2|tL");
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("has 4 virtual stages, pp * vp is 2 * 1 = 2"));
  p.layout = parse_pipeline_layout("Et*4|t*5L");
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("places 9 transformer layers, model 'small-gpt' has 8"));
  p.layout = parse_pipeline_layout("Et*4|t*4mL");
  CHECK_THROWS_WITH(p.validate(m), Catch::Contains("places 1 multi-token-prediction blocks (m), model 'small-gpt' has 0"));
  // A split no even rule reaches: 7 layers over 2 stages.
  const transformer seven = test::small_gpt(7);
  p.layout = parse_pipeline_layout("Et*4|t*3L");
  CHECK_NOTHROW(p.validate(seven));
  p.layout = {};
  CHECK_THROWS_WITH(p.validate(seven), Catch::Contains("must be divisible by pp * vp"));
}

TEST_CASE("a layout places a MoE model's dense first layers by their index", "[model][pipeline][layout][moe]") {
  using namespace lumos::model;
  transformer m = deepseek_v3();
  m.mtp_layers = 0;
  parallel_config p = test::config(1, 4, 64, 1, 4096);
  p.vp = 4;
  p.layout = parse_pipeline_layout("Et*4|(t*4|)*14tL");
  // Stage 0 holds virtual stages 0, 4, 8, 12: layers 0-3 (the 3 dense ones first), 16-19, 32-35, 48-51.
  CHECK(stage_moe_layers(m, p, 0) == 13);
  CHECK(stage_moe_layers(m, p, 1) == 16);
  CHECK(p.stage_layers(m, 3) == 13);  // virtual stages 3, 7, 11 and 15 (one layer and the loss)
  CHECK(stage_moe_layers(m, p, 3) == 13);
}

TEST_CASE("Megatron's first and last pipeline stage layers split the rest evenly", "[model][pipeline][layout]") {
  using namespace lumos::model;
  CHECK(uneven_first_last_layout(61, 0, 16, 1, 4, 1).blocks == parse_pipeline_layout("Et*4|(t*4|)*14tL").blocks);
  const pipeline_layout with_mtp = uneven_first_last_layout(61, 1, 32, 1, 1, 0);
  CHECK(with_mtp.blocks == parse_pipeline_layout("Et|(tt|)*30mL").blocks);
  CHECK(with_mtp.mtp == 1);
  CHECK(uneven_first_last_layout(8, 0, 4, 1, 2, -1).blocks == std::vector<std::int64_t>{2, 2, 2, 2});
  // With chunks, each stage's layers split over its chunks: stage 0 holds 2 (1 + 1), stage 1 8 (4 + 4);
  // virtual stage v is chunk v / pp of stage v mod pp.
  CHECK(uneven_first_last_layout(10, 0, 2, 2, 2, -1).blocks == std::vector<std::int64_t>{1, 4, 1, 4});
  CHECK_THROWS_WITH(uneven_first_last_layout(61, 0, 16, 1, 5, 1), Catch::Contains("must split evenly"));
  CHECK_THROWS_WITH(uneven_first_last_layout(8, 0, 2, 1, 9, 0), Catch::Contains("leave -1 of 8 layers"));
  CHECK_THROWS_WITH(uneven_first_last_layout(8, 0, 2, 2, 3, -1), Catch::Contains("a stage's 3 layers do not split evenly over vp = 2"));
  CHECK_THROWS_WITH(uneven_first_last_layout(8, 0, 1, 1, 3, -1), Catch::Contains("need pp >= 2"));
}
