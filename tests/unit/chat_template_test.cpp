// Chat templates: exact strings of models.md and of the Qwen2.5 Jinja template (hand-derived).
#include "io/chat_template.h"

#include <fstream>

#include "core/error.h"
#include "test_util.h"

namespace tessera {
namespace {

TEST(ChatTemplate, LladaInstructSingleTurnMatchesModelsMd) {
  std::string got = apply_chat_template(ChatFamily::LladaInstruct, {{"user", "What is 2+2?"}}, true);
  EXPECT_EQ(got,
            "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, LladaInstructMultiTurnTrimsContent) {
  std::string got = apply_chat_template(
      ChatFamily::LladaInstruct,
      {{"system", "Be brief."}, {"user", "  Hi\n"}, {"assistant", "Hello!"}, {"user", "Bye"}}, false);
  EXPECT_EQ(got,
            "<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>");
}

// Gemma 4 (DiffusionGemma, shared/specs/diffusion-gemma.md section 7): thinking off renders the spec's
// prompt (which tokenises to [2, 105, 2364, 107, ..., 106, 107, 105, 4368, 107, 100, 45518, 107, 101]).
TEST(ChatTemplate, Gemma4MatchesTheSpecsPrompt) {
  const ChatTemplate t = ChatTemplate::of_family(ChatFamily::Gemma4, "<bos>", "<eos>");
  EXPECT_TRUE(t.takes_thinking());
  Conversation c = Conversation::of({{"user", "What is 2+2?"}});
  EXPECT_EQ(t.render(c),
            "<bos><|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  c.enable_thinking = true;  // <|think|> in a system turn; the model opens the thought channel itself
  EXPECT_EQ(t.render(c),
            "<bos><|turn>system\n<|think|><turn|>\n<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n");
  Conversation m =
      Conversation::of({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}});
  EXPECT_EQ(t.render(m),
            "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n"
            "<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  test::expect_error(
      [&] {
        (void)t.render(Conversation::of({{"tool", "{}"}}));
      },
      "not supported by the built-in Gemma 4");
  EXPECT_EQ(t.reasoning().open, "<|channel>thought");
}

TEST(ChatTemplate, ChatMLDefaultSystemTurnMatchesModelsMd) {
  EXPECT_EQ(apply_chat_template(ChatFamily::ChatML, {{"user", "Hello"}}, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
}

// Expected strings derived by hand from chat-template-qwen2.5-instruct.jinja (no tools):
// a leading system message is rendered as '<|im_start|>system\n' + content + '<|im_end|>\n';
// user / assistant turns as '<|im_start|>' + role + '\n' + content + '<|im_end|>\n'; consecutive
// tool messages share one '<|im_start|>user' turn of '\n<tool_response>\n' + content +
// '\n</tool_response>' parts; the generation prompt is '<|im_start|>assistant\n'.
// (Without a system message the Qwen2.5 file says "You are Qwen, created by Alibaba Cloud. You are
// a helpful assistant."; Dream's template, which tessera follows, says "You are a helpful assistant.")
TEST(ChatTemplate, ChatMLMatchesQwen25JinjaWithSystem) {
  EXPECT_EQ(apply_chat_template(ChatFamily::ChatML, {{"system", "You are terse."}, {"user", "Hi"}}, true),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(
      apply_chat_template(
          ChatFamily::ChatML,
          {{"system", "S"}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?\n"}}, false),
      "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
      "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?\n<|im_end|>\n");
  EXPECT_EQ(apply_chat_template(
                ChatFamily::ChatML,
                {{"system", "S"}, {"user", "q"}, {"assistant", "a"}, {"tool", "r1"}, {"tool", "r2"}}, true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq<|im_end|>\n"
            "<|im_start|>assistant\na<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  // a system message that is not first is an ordinary turn
  EXPECT_EQ(apply_chat_template(ChatFamily::ChatML, {{"user", "u"}, {"system", "s2"}}, false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
            "<|im_start|>system\ns2<|im_end|>\n");
}

TEST(ChatTemplate, ChatMLTemplateFileHasTheStructureWeFollow) {
  TESSERA_SKIP_WITHOUT_SHARED("tokenizers/qwen2/chat-template-qwen2.5-instruct.jinja");
  std::ifstream f(test::shared_dir() / "tokenizers/qwen2/chat-template-qwen2.5-instruct.jinja");
  std::string t((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* piece : {"'<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n'",
                            "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n'",
                            "'<|im_start|>assistant\\n'", "'\\n<tool_response>\\n'", "'\\n</tool_response>'"})
    EXPECT_NE(t.find(piece), std::string::npos) << piece;
}

TEST(ChatTemplate, LladaMoeMatchesModelsMd) {
  EXPECT_EQ(apply_chat_template(ChatFamily::LladaMoE, {{"user", "Hi there"}}, true),
            "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Hi there<|role_end|>"
            "<role>ASSISTANT</role>");
  EXPECT_EQ(apply_chat_template(ChatFamily::LladaMoE, {{"system", "sys"}, {"user", "a"}, {"assistant", "b"}},
                                false),
            "<role>SYSTEM</role>sys<|role_end|><role>HUMAN</role>a<|role_end|><role>ASSISTANT</role>b"
            "<|role_end|>");
}

TEST(ChatTemplate, NoneConcatenatesAndUnknownRoleThrows) {
  EXPECT_EQ(apply_chat_template(ChatFamily::None, {{"user", "Once upon"}}, true), "Once upon");
  try {
    apply_chat_template(ChatFamily::ChatML, {{"robot", "x"}}, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("robot"), std::string::npos);
  }
}

// A template that does not parse is not a load error: it fails where it is rendered, naming its line.
TEST(ChatTemplate, ABrokenTemplateFailsWhenRenderedNamingItsLine) {
  const ChatTemplate t("{% for m in messages %}\n{{ m.content }", "", "broken.jinja", "<s>", "</s>", false);
  EXPECT_FALSE(t.empty());
  test::expect_error([&] { t.render(Conversation::of({{"user", "hi"}})); }, "broken.jinja:2:");
  const ChatTemplate ok("{% for m in messages %}{{ bos_token }}{{ m.content }}{% endfor %}", "", "ok.jinja",
                        "<s>", "</s>", false);
  EXPECT_EQ(ok.render(Conversation::of({{"user", "hi"}})), "<s>hi");
}

void write(const std::filesystem::path& p, const std::string& s) {
  std::ofstream(p) << s;
}

TEST(ChatTemplate, DetectFamilyFromTokenizerConfigThenConfig) {
  auto d = test::temp_dir("chat_detect");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::None);
  write(d / "config.json", R"({"model_type": "llada"})");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::LladaInstruct);
  write(d / "config.json", R"({"model_type": "Dream"})");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::ChatML);
  write(d / "config.json", R"({"model_type": "llada", "architectures": ["LLaDAMoEModelLM"]})");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::LladaMoE);
  write(d / "tokenizer_config.json",
        R"({"chat_template": "{% for m in messages %}<|start_header_id|>{{ m.role }}{% endfor %}"})");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::LladaInstruct);
  write(d / "tokenizer_config.json", R"({"chat_template": "{{ '<|im_start|>' }}"})");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::ChatML);
  write(d / "tokenizer_config.json",
        R"({"chat_template": [{"name": "default", "template": "<role>HUMAN</role>"}]})");
  EXPECT_EQ(detect_chat_family(d), ChatFamily::LladaMoE);
  write(d / "tokenizer_config.json", "{broken");
  EXPECT_THROW(detect_chat_family(d), Error);
}

}  // namespace
}  // namespace tessera
