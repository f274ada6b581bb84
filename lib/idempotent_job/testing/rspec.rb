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
        @same = nil
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

      # Adds the same-operation scenario: these arguments differ from the matched ones
      # only where the operation key must not look (a request time, a trace id).
      # @param args [Array] the same operation's positional arguments, or
      # @param named [Hash] by parameter name
      # @return [self]
      def and_same_operation_as(*args, **named)
        @same = named.empty? ? args : named
        self
      end

      # @param count [Integer] deliveries in the repeated scenario (default 3)
      # @return [self]
      def delivered(count)
        @times = Integer(count)
        self
      end

      # @param count [Integer] concurrent workers (default 3)
      # @param via [Array<Symbol>] :threads and/or :processes (default both where
      #   fork exists); the kill scenarios run in a forked worker either way
      # @return [self]
      def with_workers(count, via: @via)
        @workers = Integer(count)
        @via = Array(via)
        self
      end

      # Runs only these scenarios.
      # @param names [Array<Symbol>] from {Replay::SCENARIOS}
      # @return [self]
      # @raise [ArgumentError] for an unknown name (and, when matching, for one that
      #   cannot run: :distinct without {#and_distinct_from}, :same_operation without
      #   {#and_same_operation_as}, a process scenario without fork)
      def in_scenarios(*names)
        unknown = names - Replay::SCENARIOS
        raise ArgumentError, "unknown scenarios #{unknown.inspect}; known: #{Replay::SCENARIOS.inspect}" if
          unknown.any?

        @only = names
        self
      end

      # @param job_class [Class, PlainJob] the job under test (a Sidekiq job class, a PlainJob, or
      #   another job a registered Testing::Subjects kind handles)
      # @return [Boolean] whether every scenario passed
      def matches?(job_class)
        @job_class = job_class
        @results = run_scenarios
        !@results.empty? && @results.all?(&:passed?)
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
        return "expected #{@job_class} to be idempotent for #{@args.inspect}, but no scenario ran" if @results.empty?

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
        Testing.disabled? ? " (with the gem DISABLED by #{Testing.disabled_by})" : ""
      end

      def wanted?(name)
        @only.nil? || @only.include?(name)
      end

      def fork?
        Process.respond_to?(:fork)
      end

      # Scenarios asked for by name that cannot run are an error, not a silent pass.
      def check_runnable!
        unrunnable = { distinct: @other.nil?, same_operation: @same.nil?, concurrent_processes: !fork?,
                       killed_after_claim: !fork?, killed_after_effect: !fork? }
        missing = unrunnable.select { |name, gone| gone && @only&.include?(name) }
        return if missing.empty?

        raise ArgumentError, "#{@job_class}: cannot run #{missing.keys.join(", ")} (distinct needs " \
                             "and_distinct_from, same_operation needs and_same_operation_as, the others fork)"
      end

      def run_scenarios
        check_runnable!
        replay = Replay.new(@job_class, @args, effect: @effect, effect_at: @effect_at)
        results = []
        results << replay.repeated(times: @times) if wanted?(:repeated)
        @via.each do |via|
          results << replay.concurrent(workers: @workers, via:) if wanted?(:"concurrent_#{via}")
        end
        %i[claim effect].each do |after|
          results << replay.killed(after:) if fork? && wanted?(:"killed_after_#{after}")
        end
        results.concat(operation_scenarios(replay))
      end

      def operation_scenarios(replay)
        results = []
        results << replay.distinct(@other) if @other && wanted?(:distinct)
        results << replay.same_operation(@same) if @same && wanted?(:same_operation)
        results
      end
    end

    # Helpers for examples that want the scenarios one by one.
    module Helpers
      # @param job_class [Class, PlainJob] the job (see {BeIdempotentFor#matches?})
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
