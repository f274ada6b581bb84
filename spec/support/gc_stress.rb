# frozen_string_literal: true

# IDEMPOTENT_JOB_GC_STRESS=1: every call into the native binding runs with
# GC.stress on (a full GC at every allocation; the one call of a delivery,
# `Native::Protocol#perform`, included), so a Ruby object the binding holds
# without marking, or frees too early, crashes at once instead of once in a while.
# bin/test runs spec/idempotent_job/native_spec.rb this way.
module GCStress
  # Whether this run has GC.stress on in native calls. A bound in seconds an example
  # checks (an interrupt reaching a blocked thread) is a timing assumption GC.stress
  # breaks: two threads blocked in native calls keep it on process-wide, and every
  # allocation then runs a full GC. Such examples allow {PATIENCE} seconds under it.
  ACTIVE = ENV["IDEMPOTENT_JOB_GC_STRESS"] == "1"
  # Seconds an example's bound becomes under GC.stress (see {ACTIVE}).
  PATIENCE = 60

  # @param seconds [Numeric] the example's bound without GC.stress
  # @return [Numeric] `seconds`, or {PATIENCE} under GC.stress
  def self.bound(seconds) = ACTIVE ? PATIENCE : seconds

  # Calls that block for long (the heartbeat watch thread's sleep in the core): GC.stress
  # is process-wide, and would stay on for everything else while they wait.
  BLOCKING = %i[heartbeat_alarm].freeze

  def self.wrap(target)
    names = target.instance_methods(false) - BLOCKING
    target.prepend(Module.new do
      names.each do |name|
        define_method(name) do |*args, &block|
          GC.stress = true
          super(*args, &block)
        ensure
          GC.stress = false
        end
      end
    end)
  end

  def self.install!
    native = IdempotentJob::Native
    targets = [native::Store, native::Store.singleton_class, native::Protocol, native::HeartbeatReader,
               native::Transaction]
    (targets + [native.singleton_class]).each { |t| wrap(t) }
  end
end

GCStress.install! if GCStress::ACTIVE
