# frozen_string_literal: true

require "rspec/expectations"

module IdempotentJob
  module Testing
    # RSpec matchers and helpers, included in every example group when
    # `idempotent_job/testing` is required with RSpec loaded.
    module Matchers
      # Passes when every scenario keeps the job's effect to once (or to what its
      # stale policy allows): the same arguments delivered several times, concurrent
      # workers (threads and processes), a worker killed after its claim and one
      # killed after its effect (with redeliveries before and after the lease), and,
      # with {BeIdempotentFor#and_distinct_from}, two distinct operations.
      #
      #   expect(ChargeOrderJob).to be_idempotent_for(order_id: 42, amount_cents: 1500)
      #     .with_effect { Charge.where(order_id: 42).count }
      #
      # @param args [Array] perform's positional arguments, or
      # @param named [Hash] perform's arguments by parameter name
      # @return [BeIdempotentFor]
      def be_idempotent_for(*args, **named)
        BeIdempotentFor.new(named.empty? ? args : named)
      end
    end

    # The matcher behind {Matchers#be_idempotent_for}. Its failure message says, for
    # each failing delivery pattern, which deliveries ran the body and how many times
    # the effect happened.
    class BeIdempotentFor
      # @param args [Array, Hash] the operation's arguments
      def initialize(args)
        @args = args
        @times = 3
        @workers = 3
        @via = Process.respond_to?(:fork) ? %i[threads processes] : %i[threads]
        @only = nil
        @other = nil
      end

      # @yieldreturn [Numeric] a count of the effect (rows, calls to a stand-in)
      #   that every worker's writes change: it is read before and after each scenario
      # @param at [String, nil] "Class#method" / "Class.method" where the effect
      #   ends inside the body (the "killed after its effect" worker dies there)
      # @return [self]
      def with_effect(at: nil, &block)
        @effect = block
        @effect_at = at
        self
      end

      # Adds the two-distinct-operations scenario.
      # @param args [Array] another operation's positional arguments, or
      # @param named [Hash] by parameter name
      # @return [self]
      def and_distinct_from(*args, **named)
        @other = named.empty? ? args : named
        self
      end

      # @param count [Integer] deliveries in the repeated scenario (default 3)
      # @return [self]
      def delivered(count)
        @times = Integer(count)
        self
      end

      # @param count [Integer] concurrent workers (default 3)
      # @param via [Array<Symbol>] :threads and/or :processes (default both)
      # @return [self]
      def with_workers(count, via: @via)
        @workers = Integer(count)
        @via = Array(via)
        self
      end

      # Runs only these scenarios.
      # @param names [Array<Symbol>] from {Replay::SCENARIOS}
      # @return [self]
      # @raise [ArgumentError] for an unknown name
      def in_scenarios(*names)
        unknown = names - Replay::SCENARIOS
        raise ArgumentError, "unknown scenarios #{unknown.inspect}; known: #{Replay::SCENARIOS.inspect}" if
          unknown.any?

        @only = names
        self
      end

      # @param job_class [Class] the Sidekiq job class under test
      # @return [Boolean] whether every scenario passed
      def matches?(job_class)
        @job_class = job_class
        @results = run_scenarios
        @results.all?(&:passed?)
      end

      # @param job_class [Class]
      # @return [Boolean] whether some scenario failed (for `not_to`)
      def does_not_match?(job_class)
        !matches?(job_class)
      end

      # @return [Array<Result>] the scenarios' results after a match
      attr_reader :results

      # @return [String]
      def failure_message
        failed = @results.reject(&:passed?)
        "expected #{@job_class} to be idempotent for #{@args.inspect}#{gem_state}, but " \
        "#{failed.size} of #{@results.size} delivery patterns repeated or lost its effect:\n\n" +
          failed.map(&:to_s).join("\n\n")
      end

      # @return [String]
      def failure_message_when_negated
        "expected #{@job_class} not to be idempotent for #{@args.inspect}#{gem_state}, but every delivery " \
          "pattern kept its effect to once:\n\n#{@results.map(&:to_s).join("\n\n")}"
      end

      # @return [String]
      def description
        "be idempotent for #{@args.inspect}"
      end

      private

      def gem_state
        Testing.disabled? ? " (with the gem DISABLED: #{Testing::DISABLE_ENV})" : ""
      end

      def wanted?(name)
        @only.nil? || @only.include?(name)
      end

      def run_scenarios
        replay = Replay.new(@job_class, @args, effect: @effect, effect_at: @effect_at)
        results = []
        results << replay.repeated(times: @times) if wanted?(:repeated)
        @via.each do |via|
          results << replay.concurrent(workers: @workers, via:) if wanted?(:"concurrent_#{via}")
        end
        results << replay.killed(after: :claim) if wanted?(:killed_after_claim) && @via.include?(:processes)
        results << replay.killed(after: :effect) if wanted?(:killed_after_effect) && @via.include?(:processes)
        results << replay.distinct(@other) if @other && wanted?(:distinct)
        results
      end
    end

    # Helpers for examples that want the scenarios one by one.
    module Helpers
      # @param job_class [Class] a Sidekiq job class
      # @param args [Array] perform's positional arguments, or
      # @param named [Hash] by parameter name
      # @param effect [#call, nil] a count of the effect (see {Replay#initialize})
      # @param effect_at [String, nil] see {Replay#initialize}
      # @return [Replay]
      def replay_job(job_class, *args, effect: nil, effect_at: nil, **named)
        Replay.new(job_class, named.empty? ? args : named, effect:, effect_at:)
      end
    end
  end
end

RSpec.configure do |config|
  config.include IdempotentJob::Testing::Matchers
  config.include IdempotentJob::Testing::Helpers
end
