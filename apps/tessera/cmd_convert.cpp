// tessera convert-llama2c MODEL.bin TOKENIZER.bin OUT_DIR
#include <cstdio>
#include <memory>
#include <string>

#include "apps/tessera/commands.h"
#include "io/llama2c.h"

namespace tessera::cli {

void add_convert(CLI::App& app, Registry& reg) {
  auto* sub = app.add_subcommand("convert-llama2c",
                                 "Convert a llama2.c model + tokenizer into a checkpoint directory");
  auto args = std::make_shared<std::array<std::string, 3>>();
  sub->add_option("model", (*args)[0], "llama2.c model .bin")->required();
  sub->add_option("tokenizer", (*args)[1], "llama2.c tokenizer .bin")->required();
  sub->add_option("out_dir", (*args)[2], "output directory")->required();
  reg.handlers.emplace_back(sub, [args] {
    convert_llama2c((*args)[0], (*args)[1], (*args)[2]);
    std::printf("wrote %s\n", (*args)[2].c_str());
    return 0;
  });
}

}  // namespace tessera::cli
