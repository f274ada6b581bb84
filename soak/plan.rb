# frozen_string_literal: true

module Soak
  # What the producer will enqueue, decided up front from a seeded random generator:
  # M distinct operations spread evenly over the run, the four job types in turn, and
  # duplicate deliveries making up a given share of all deliveries, of three kinds:
  # * :repeat — the producer enqueues the operation again (a new jid) within 2 s;
  # * :concurrent — copies pushed together with the first delivery, so idle worker
  #   threads take them at the same moment;
  # * :delayed — the operation enqueued again 5 to 30 s later (often after it
  #   completed), as a producer re-sending after a timeout would.
  class Plan
    # One operation: its job class, operation key and arguments (the same in every delivery).
    Operation = Struct.new(:index, :job_class, :key, :amount_cents, keyword_init: true) do
      # @return [String] "<job type>/<operation key>"
      def reference
        Soak.reference(job_class, key)
      end

      # @return [Array] the job's arguments
      def args
        [key, amount_cents]
      end
    end

    # One push: `copies` deliveries of an operation at `at` seconds into the run; kind
    # :first (the first delivery), :concurrent (the first delivery and its copies, in one
    # bulk push), :repeat or :delayed.
    Push = Struct.new(:at, :operation, :copies, :kind, keyword_init: true)

    # Duplicate kinds and their share of the duplicates.
    KINDS = %i[repeat concurrent delayed].freeze

    # @return [Array<Operation>]
    attr_reader :operations
    # @return [Array<Push>] ordered by time
    attr_reader :pushes

    # @param operations [Integer] distinct operations (M)
    # @param duplicates [Float] share of all deliveries that are duplicates, 0 ≤ d < 1
    # @param seconds [Numeric] length of the enqueue phase
    # @param random [Random] the seeded generator
    # @param run [String] a tag prefixed to every operation key
    def initialize(operations:, duplicates:, seconds:, random:, run:)
      @random = random
      @seconds = seconds.to_f
      types = JOB_TYPES.keys
      @operations = Array.new(operations) do |i|
        Operation.new(index: i, job_class: types[i % types.size], key: format("%<run>s-%<i>06d", run:, i:),
                      amount_cents: 100 + random.rand(10_000))
      end
      @firsts = @operations.map do |op|
        Push.new(at: @seconds * op.index / operations, operation: op, copies: 1, kind: :first)
      end
      @pushes = (@firsts + duplicate_pushes(duplicate_count(operations, duplicates))).sort_by(&:at)
    end

    # @return [Hash{Symbol => Integer}] duplicate deliveries planned, by kind
    def duplicates_by_kind
      KINDS.to_h do |kind|
        extra = @pushes.select { |push| push.kind == kind }.sum(&:copies)
        extra -= @firsts.count { |push| push.kind == :concurrent } if kind == :concurrent
        [kind, extra]
      end
    end

    private

    def duplicate_count(operations, share)
      raise ArgumentError, "--duplicates must be at least 0 and below 1" unless share >= 0 && share < 1

      (operations * share / (1 - share)).round
    end

    # Spends the duplicates in groups of 1 or 2 extra deliveries on random operations.
    def duplicate_pushes(remaining)
      pushes = []
      while remaining.positive?
        first = @firsts[@random.rand(@firsts.size)]
        extra = [remaining, 1 + @random.rand(2)].min
        remaining -= extra
        kind = KINDS[@random.rand(KINDS.size)]
        if kind == :concurrent
          first.copies += extra
          first.kind = :concurrent
        else
          pushes << Push.new(at: later(first.at, kind), operation: first.operation, copies: extra, kind:)
        end
      end
      pushes
    end

    def later(at, kind)
      delay = kind == :repeat ? 0.05 + (@random.rand * 2) : 5 + (@random.rand * 25)
      [at + delay, @seconds].min
    end
  end
end
