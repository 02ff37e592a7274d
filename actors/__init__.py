"""Actors: one module per single-owner actor. Each depends on `messages/` only; the runtime
injects what an actor needs from outside (its store connection, a clock, a timer, a crash
reporter) through `actors.context.ActorContext`."""
