// A constraint on the text a generation writes (structured output: a JSON Schema, any JSON object),
// checked token by token. The decode layer knows only this interface; the caller that has a tokenizer
// (runtime/session: runtime/json_constraint.h) implements it over the vocabulary's bytes.
#pragma once
#include <cstdint>
#include <memory>

namespace tessera {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The constraint after some tokens of the answer.
  class State {
   public:
    virtual ~State() = default;
    virtual std::unique_ptr<State> clone() const = 0;
    // Whether token t may come next with the answer still completable in `left` more tokens after it
    // (an EOS only once the text is complete; after an EOS only EOS).
    virtual bool allows(int32_t t, int64_t left) const = 0;
    // Takes token t (one that allows() accepted).
    virtual void take(int32_t t) = 0;
    // The text so far is complete (an EOS may end it).
    virtual bool complete() const = 0;
    // The fewest tokens that complete the text (0 when complete).
    virtual int64_t min_tokens() const = 0;
  };
  virtual std::unique_ptr<State> start() const = 0;
};

}  // namespace tessera
