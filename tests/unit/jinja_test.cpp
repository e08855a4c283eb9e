// The Jinja2 interpreter (src/io/jinja) against outputs of Python's jinja2 3.1 in the environment
// transformers renders chat templates with (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loopcontrols, transformers' tojson / raise_exception). Every expected string below is jinja2's output.
#include "io/jinja/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace {

using tessera::jinja::Limits;
using tessera::jinja::Template;

std::string render(const std::string& src, const std::string& ctx = "{}", const Limits& limits = {}) {
  return Template(src).render(nlohmann::ordered_json::parse(ctx), limits);
}

// The message of the tessera::Error that parsing or rendering throws ("" if none).
std::string error_of(const std::string& src, const std::string& ctx = "{}", const Limits& limits = {}) {
  try {
    render(src, ctx, limits);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Jinja, WhitespaceControl) {
  EXPECT_EQ(render(R"~(a  {{- ' x ' -}}  b
  {%- if true -%}
  c  
  {%- endif %}
)~",
                   R"~({})~"),
            R"~(a x bc)~");
}

TEST(Jinja, TrimAndLstripBlocks) {
  EXPECT_EQ(render(R"~(  {{ 1 }}
  {% if true %}
  x
  {% endif %}
 {% for i in [1, 2] %}
  {{ i }}
 {% endfor %}
done
)~",
                   R"~({})~"),
            R"~(  1
  x
  1
  2
done)~");
}

TEST(Jinja, PlusDisablesLstripAndTrim) {
  EXPECT_EQ(render(R"~(  {%+ if true +%}
a{% endif %})~",
                   R"~({})~"),
            R"~(  
a)~");
}

TEST(Jinja, CommentsAndRaw) {
  EXPECT_EQ(render(R"~(a  {# c #}  b
  {# line #}
c{% raw %}
{{ y }}{% endraw %}
z)~",
                   R"~({})~"),
            R"~(a    b
c
{{ y }}z)~");
}

TEST(Jinja, LoopVariables) {
  EXPECT_EQ(
      render(
          R"~({% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem.role if loop.previtem }}{{ loop.nextitem.role if loop.nextitem is defined }}{{ loop.cycle('a', 'b') }};{% endfor %})~",
          R"~({"messages": [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi \"there\" é\n"}, {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.5, "y": "ü", "z": [1, null, true]}}}]}]})~"),
      R"~(1032TrueFalse3usera;2121FalseFalse3systemassistantb;3210FalseTrue3usera;)~");
}

TEST(Jinja, LoopFilterElseBreakContinue) {
  EXPECT_EQ(
      render(
          R"~({% for x in [3, 1, 2] if x > 1 %}{{ x }}/{{ loop.length }} {% else %}none{% endfor %}{% for x in [] %}{% else %}empty{% endfor %} {% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %})~",
          R"~({})~"),
      R"~(3/2 2/2 empty 0134)~");
}

TEST(Jinja, TupleUnpacking) {
  EXPECT_EQ(
      render(
          R"~({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% set a, b = 1, 2 %}{{ a }}{{ b }})~",
          R"~({"d": {"z": 1, "a": [1, 2]}})~"),
      R"~(z=1;a=[1, 2];12)~");
}

TEST(Jinja, ScopingSetInLoopDoesNotLeak) {
  EXPECT_EQ(
      render(
          R"~({% set x = 1 %}{% for i in range(2) %}{{ x }}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}|{% for i in range(3) %}{% if i == 0 %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %})~",
          R"~({})~"),
      R"~(12121|[5][][])~");
}

TEST(Jinja, NamespaceScoping) {
  EXPECT_EQ(
      render(
          R"~({% set ns = namespace(found=false, n=0) %}{% for m in messages %}{% if m.role != 'system' %}{% set ns.found = true %}{% set ns.n = ns.n + 1 %}{% endif %}{% endfor %}{{ ns.found }} {{ ns.n }} {{ ns }})~",
          R"~({"messages": [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi \"there\" é\n"}, {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.5, "y": "ü", "z": [1, null, true]}}}]}]})~"),
      R"~(True 2 <Namespace {'found': True, 'n': 2}>)~");
}

TEST(Jinja, BlockSetAndFilterBlock) {
  EXPECT_EQ(
      render(
          R"~({% set e %}block {{ 1 + 1 }}{% endset %}[{{ e }}]{% set g | upper %}xy{% endset %}{{ g }}{% filter upper %}abc{% endfilter %})~",
          R"~({})~"),
      R"~([block 2]XYABC)~");
}

TEST(Jinja, MacrosDefaultsKeywordsCaller) {
  EXPECT_EQ(
      render(
          R"~({% macro m(a, b=2) %}{{ a }}{{ b }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1) }}|{{ m(1, 3, 4, c=5) }}|{{ m(b=7, a=6) }}|{% macro wrap(x) %}<{{ caller(x) }}>{% endmacro %}{% call(v) wrap('q') %}[{{ v }}]{% endcall %})~",
          R"~({})~"),
      R"~(12(){}|13(4,){'c': 5}|67(){}|<[q]>)~");
}

TEST(Jinja, Slicing) {
  EXPECT_EQ(
      render(
          R"~({{ s[1] }} {{ s[::-1] }} {{ s[-2:] }} {{ s[1:-1:2] }} {{ xs[::-2] }} {{ xs[5:0:-1] }} {{ xs[-10:10] }} {{ 'abcdef'[4:1:-2] }})~",
          R"~({"s": "héllo", "xs": [3, 1, 2, 5]})~"),
      R"~(é olléh lo él [5, 1] [5, 2, 1] [3, 1, 2, 5] ec)~");
}

TEST(Jinja, Arithmetic) {
  EXPECT_EQ(
      render(
          R"~({{ 7 // -2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ 'ab' * 3 }} {{ -7.5 % 2 }} {{ 1 + 2.0 }} {{ 'a' ~ 1 ~ none }} {{ -2 ** 2 }})~",
          R"~({})~"),
      R"~(-4 2 3.5 2.0 1024 0.5 3.0 ababab 0.5 3.0 a1None 4)~");
}

TEST(Jinja, PythonReprPrinting) {
  EXPECT_EQ(
      render(
          R"~({{ [1, 'a\'b', "c\"d", 'e"f\'g', none, true, 1.5, 1e20, 0.1, 1e-5, 1e16, 1e15] }} {{ {'k': (1,), 'j': ()} }} {{ none }} {{ 1.0 }} {{ 2.675|round(2) }} {{ 2.5|round }})~",
          R"~({})~"),
      R"~([1, "a'b", 'c"d', 'e"f\'g', None, True, 1.5, 1e+20, 0.1, 1e-05, 1e+16, 1000000000000000.0] {'k': (1,), 'j': ()} None 1.0 2.67 2.0)~");
}

TEST(Jinja, TojsonHF) {
  EXPECT_EQ(
      render(
          R"~({{ messages[2].tool_calls[0].function.arguments|tojson }}|{{ messages[2].tool_calls[0].function|tojson(indent=2) }}|{{ d|tojson(sort_keys=true, separators=(',', ':')) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ [1.0, 1e20, 0.1, none, 'a\u0001\tb<>&'] | tojson }})~",
          R"~({"messages": [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi \"there\" é\n"}, {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.5, "y": "ü", "z": [1, null, true]}}}]}], "d": {"b": 1, "a": "x"}})~"),
      R"~({"x": 1.5, "y": "ü", "z": [1, null, true]}|{
  "name": "f",
  "arguments": {
    "x": 1.5,
    "y": "ü",
    "z": [
      1,
      null,
      true
    ]
  }
}|{"a":"x","b":1}|"\u00e9"|[1.0, 1e+20, 0.1, null, "a\u0001\tb<>&"])~");
}

TEST(Jinja, UndefinedHandling) {
  EXPECT_EQ(
      render(
          R"~([{{ zz }}]{{ zz|length }}{{ zz is defined }}{{ zz is undefined }}{% for x in zz %}x{% endfor %}{{ zz|default('dflt') }}{{ d.missing is defined }}{{ 'a' in zz }}{{ zz ~ 'b' }}{{ none.x }}|{{ 1 if false }}|{{ d.get('q', 3) }})~",
          R"~({"d": {}})~"),
      R"~([]0FalseTruedfltFalseFalseb||3)~");
}

TEST(Jinja, Filters1) {
  EXPECT_EQ(
      render(
          R"~({{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ "they're bill's-friend"|title }}|{{ 'hELLO'|capitalize }}|{{ 'ÀÉ'|lower }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ [1, 2]|first }}{{ [1, 2]|last }}|{{ ''|default('x', true) }}|{{ xs|length }}{{ xs|count }}|{{ xs|join(', ') }}|{{ xs|list }}|{{ xs|reverse|list }})~",
          R"~({"xs": [3, 1, 2]})~"),
      R"~(hi|hi|They're Bill's-Friend|Hello|àé|bba|12|x|33|3, 1, 2|[3, 1, 2]|[2, 1, 3])~");
}

TEST(Jinja, Filters2) {
  EXPECT_EQ(
      render(
          R"~({{ messages|selectattr('role', 'equalto', 'user')|list|length }} {{ messages|map(attribute='role')|join(',') }} {{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }} {{ messages|selectattr('tool_calls', 'defined')|list|length }} {{ messages|selectattr('tool_calls')|list|length }} {{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3]|reject('odd')|list }} {{ [1, 2]|map('string')|join('-') }})~",
          R"~({"messages": [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi \"there\" é\n"}, {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.5, "y": "ü", "z": [1, null, true]}}}]}]})~"),
      R"~(1 system,user,assistant ['system', 'assistant'] 1 1 [1, 3] [2] 1-2)~");
}

TEST(Jinja, Filters3) {
  EXPECT_EQ(
      render(
          R"~({{ [3, 1, 2]|sum }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['B', 'a', 'C']|sort }} {{ ['B', 'a', 'C']|sort(reverse=true, case_sensitive=true) }} {{ messages|sort(attribute='role')|map(attribute='role')|list }} {{ [1, 2, 1, 'a', 'A']|unique|list }} {{ {'b': 1, 'a': 2}|dictsort }} {{ [1, 2, 3]|batch(2, 0)|list }} {{ {'a': 1}|items|list }})~",
          R"~({"messages": [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hi \"there\" é\n"}, {"role": "assistant", "content": "Yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1.5, "y": "ü", "z": [1, null, true]}}}]}]})~"),
      R"~(6 1 3 ['a', 'B', 'C'] ['a', 'C', 'B'] ['assistant', 'system', 'user'] [1, 2, 'a'] [('a', 2), ('b', 1)] [[1, 2], [3, 0]] [('a', 1)])~");
}

TEST(Jinja, Filters4) {
  EXPECT_EQ(
      render(
          R"~({{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'one two  three'|wordcount }}|{{ 'ab'|center(7) }}|{{ '3'|int + 1 }} {{ '3.7'|int }} {{ 'x'|int(5) }} {{ '2.5'|float }} {{ -3|abs }} {{ 2.7|int }} {{ 3|string ~ 'x' }}|{{ '<a href="x">&</a>'|e }}|{{ '%s-%d'|format('a', 3) }})~",
          R"~({})~"),
      R"~(a
    b

    c|  a
  b|3|   ab  |4 3 5 2.5 3 2 3x|&lt;a href=&#34;x&#34;&gt;&amp;&lt;/a&gt;|a-3)~");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(
      render(
          R"~({{ xs is defined }} {{ n is none }} {{ 1 is integer }} {{ 1.0 is float }} {{ 'a' is string }} {{ d is mapping }} {{ xs is sequence }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 1 is eq 1 }} {{ 1 is ne 2 }} {{ 1 is lt 2 }} {{ 2 is gt 1 }} {{ 1 is in xs }} {{ n is sameas none }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ true is true }} {{ 1 is boolean }} {{ 1 is number }} {{ range is callable }} {{ x is not defined }} {{ d is iterable }} {{ 2 is ge 2 }} {{ 2 is le 1 }})~",
          R"~({"xs": [1], "n": null, "d": {}})~"),
      R"~(True True True True True True True True True True True True True True True True True True True False True True True True True False)~");
}

TEST(Jinja, StringMethods) {
  EXPECT_EQ(
      render(
          R"~({{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ '  x '.strip() }}|{{ 'xxa'.lstrip('x') }}|{{ 'axx'.rstrip('x') }}|{{ 'héllo'.find('l') }} {{ 'Hello'.rfind('l') }} {{ 'Hello'.count('l') }} {{ ','.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ '  '.isspace() }} {{ "they're".title() }} {{ 'ab'.upper() }} {{ 'a b'.replace(' ', '_') }} {{ '{} {}'.format(1, 'x') }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(none, 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '  a b c  '.rsplit(none, 1) }})~",
          R"~({})~"),
      R"~(True True x|a|a|2 3 2 a,b True True True They'Re AB a_b 1 x ['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a b', 'c'] ['  a b', 'c'])~");
}

TEST(Jinja, DictMethodsAndAccess) {
  EXPECT_EQ(
      render(
          R"~({{ d.keys()|list }}|{{ d.values()|list }}|{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}|{{ d['a'] }}{{ d.a }}|{{ d['items'] is callable }}|{{ dict(a=1, b='x') }})~",
          R"~({"d": {"a": 1, "b": [1, 2]}})~"),
      R"~(['a', 'b']|[1, [1, 2]]|1None9|11|True|{'a': 1, 'b': 'x'})~");
}

TEST(Jinja, LogicAndComparisons) {
  EXPECT_EQ(
      render(
          R"~({{ 0 or 'a' }}|{{ 1 and 'b' }}|{{ none or 0 }}|{{ not 1 }}|{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 'a' in 'cat' }}|{{ 2 not in [1] }}|{{ 1 == 1.0 }}|{{ true == 1 }}|{{ (1,) == [1] }}|{{ [1, 2] < [1, 3] }}|{{ 1 if false else 2 }})~",
          R"~({})~"),
      R"~(a|b|0|False|True|False|True|True|True|True|False|True|2)~");
}

TEST(Jinja, JsonContextOrderAndTypes) {
  EXPECT_EQ(
      render(R"~({% for k, v in c.items() %}{{ k }}:{{ v }} {% endfor %}{{ c|tojson }})~",
             R"~({"c": {"z": null, "a": true, "m": 1, "b": 2.5, "s": "x\"y", "l": [], "o": {}}})~"),
      R"~(z:None a:True m:1 b:2.5 s:x"y l:[] o:{} {"z": null, "a": true, "m": 1, "b": 2.5, "s": "x\"y", "l": [], "o": {}})~");
}

TEST(Jinja, TrailingNewlineDroppedAndCrlfNormalised) {
  EXPECT_EQ(render("a\r\nb\n"), "a\nb");
  EXPECT_EQ(render("a\n\n"), "a\n");
}

TEST(Jinja, RaiseExceptionNamesTheLine) {
  EXPECT_EQ(error_of("line1\n{% if true %}\n{{ raise_exception('on line 3') }}\n{% endif %}"),
            "chat template:3: on line 3");
  try {
    Template t("{{ raise_exception('x') }}", "my.jinja");
    t.render(nlohmann::ordered_json::object());
    FAIL() << "no error";
  } catch (const tessera::Error& e) {
    EXPECT_STREQ(e.what(), "my.jinja:1: x");
  }
}

TEST(Jinja, ParseErrors) {
  EXPECT_EQ(error_of("a\n{% endfor %}"), "chat template:2: unexpected 'endfor' (no open 'for')");
  EXPECT_EQ(error_of("{{ x|nofilter }}"), "chat template:1: No filter named 'nofilter'.");
  EXPECT_EQ(error_of("\n{{ x is nosuchtest }}"), "chat template:2: No test named 'nosuchtest'.");
  EXPECT_EQ(error_of("{% foo %}"), "chat template:1: unknown tag 'foo'");
  EXPECT_EQ(error_of("{% if x %}\nabc"), "chat template:2: unexpected end of template: 'if' is not closed");
  EXPECT_EQ(error_of("{% for x in y %}{% endif %}"),
            "chat template:1: unexpected 'endif' (the innermost open block is 'for')");
  EXPECT_EQ(error_of("{{ 'abc }}"), "chat template:1: unexpected end of string");
  EXPECT_EQ(error_of("{% break %}"), "chat template:1: 'break' outside a loop");
  EXPECT_EQ(error_of("{{ 1 + }}"), "chat template:1: unexpected 'end of print statement'");
  // Parse errors come from the constructor, before any render.
  EXPECT_THROW(Template("{% if %}"), tessera::Error);
}

TEST(Jinja, RuntimeErrorsAsJinja2) {
  EXPECT_EQ(error_of("{{ d.missing.x }}", R"({"d": {}})"),
            "chat template:1: 'dict object' has no attribute 'missing'");
  EXPECT_EQ(error_of("{{ zz.y }}"), "chat template:1: 'zz' is undefined");
  EXPECT_EQ(error_of("{{ zz + 1 }}"), "chat template:1: 'zz' is undefined");
  EXPECT_EQ(error_of("{{ xs[10].a }}", R"({"xs": [1]})"), "chat template:1: list object has no element 10");
  EXPECT_EQ(error_of("{{ 'abc' + 1 }}"), "chat template:1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ 1 / 0 }}"), "chat template:1: division by zero");
  EXPECT_EQ(error_of("{{ 1 < 'a' }}"),
            "chat template:1: '<' not supported between instances of 'int' and 'str'");
  EXPECT_EQ(error_of("{% for x in 3 %}{% endfor %}"), "chat template:1: 'int' object is not iterable");
  EXPECT_EQ(error_of("{{ zz|tojson }}"),
            "chat template:1: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{{ 3|length }}"), "chat template:1: object of type 'int' has no len()");
  // The immutable sandbox: list / dict mutators are unsafe (an unused reference is only undefined).
  EXPECT_EQ(error_of("{{ xs.append(1) }}", R"({"xs": []})"),
            "chat template:1: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(error_of("{{ d.update({}) }}", R"({"d": {}})"),
            "chat template:1: access to attribute 'update' of 'dict' object is unsafe.");
  EXPECT_EQ(render("{{ xs.append }}x", R"({"xs": []})"), "x");
}

TEST(Jinja, UnknownFilterInsideIfFailsOnlyWhenRun) {
  EXPECT_EQ(render("{% if false %}{{ x|nof }}{{ x is nosuch }}{% endif %}{{ x|nof if false }}ok"), "ok");
  EXPECT_EQ(error_of("{% if true %}{{ x|nof }}{% endif %}"), "chat template:1: No filter named 'nof' found.");
  EXPECT_EQ(error_of("{% if true %}{% for i in [1] %}{{ x|nof }}{% endfor %}{% endif %}"),
            "chat template:1: No filter named 'nof'.");
}

TEST(Jinja, MacroArgumentErrors) {
  EXPECT_EQ(error_of("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"),
            "chat template:1: macro 'm' takes not more than 1 argument(s)");
  EXPECT_EQ(error_of("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, b=2) }}"),
            "chat template:1: macro 'm' takes no keyword argument 'b'");
  EXPECT_EQ(render("{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}"), "[]");
}

TEST(Jinja, RangeIsCappedAsInTheSandbox) {
  EXPECT_EQ(error_of("{% for i in range(100000000) %}{% endfor %}"),
            "chat template:1: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  EXPECT_EQ(render("{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }}"),
            "[0, 1, 2][1, 3, 5][3, 2, 1]");
}

TEST(Jinja, StepLimit) {
  const char* src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
  Limits small;
  small.max_steps = 1'000'000;
  EXPECT_EQ(error_of(src, "{}", small), "chat template:1: the template ran past 1000000 steps");
  EXPECT_EQ(error_of(src), "chat template:1: the template ran past 20000000 steps");
}

TEST(Jinja, OutputLimit) {
  Limits small;
  small.max_output = 1000;
  EXPECT_EQ(error_of("{{ 'x' * 2000 }}", "{}", small),
            "chat template:1: the template built a string of more than 1000 bytes");
  EXPECT_EQ(error_of("{% for i in range(300) %}abcd{% endfor %}", "{}", small),
            "chat template:1: the template built a string of more than 1000 bytes");
  EXPECT_EQ(render("{{ 'x' * 1000 }}", "{}", small).size(), 1000u);
}

TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  EXPECT_EQ(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}"),
            "chat template:1: the template nests too deeply");
  EXPECT_EQ(error_of("{{ " + std::string(100000, '[') + std::string(100000, ']') + " }}"),
            "chat template:1: the template nests too deeply");
  std::string nots;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_EQ(error_of("{{ " + nots + "1 }}"), "chat template:1: the template nests too deeply");
  std::string ifs;
  for (int i = 0; i < 100000; ++i) ifs += "{% if 1 %}";
  EXPECT_EQ(error_of(ifs), "chat template:1: the template nests too deeply");
  // Moderate nesting is fine.
  EXPECT_EQ(render("{{ " + std::string(100, '(') + "7" + std::string(100, ')') + " }}"), "7");
  // Unbounded macro recursion stops at max_depth.
  EXPECT_EQ(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"),
            "chat template:1: macro calls nest deeper than 256 levels");
  // Values built in a loop cannot nest without bound either.
  EXPECT_NE(
      error_of("{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}")
          .find("nests deeper than"),
      std::string::npos);
}

TEST(Jinja, TemplateIsReusableAndMovable) {
  Template t("{{ a }}-{{ b|default('none') }}");
  EXPECT_EQ(t.render(nlohmann::ordered_json{{"a", 1}}), "1-none");
  Template u = std::move(t);
  EXPECT_EQ(u.render(nlohmann::ordered_json{{"a", "x"}, {"b", 2}}), "x-2");
}

TEST(Jinja, StrftimeNow) {
  std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}
