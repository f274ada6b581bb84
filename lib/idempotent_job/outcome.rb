# frozen_string_literal: true

module IdempotentJob
  # What the {Protocol} decided for one delivery, and what the block returned when it ran.
  class Outcome
    # Decisions an outcome can carry.
    # * :ran — the block ran and returned (its completion recorded, or at least attempted);
    # * :completed — the operation was already completed (or a stale-claim lookup said it was done);
    # * :held — held for a person (the :hold stale policy, or held before);
    # * :given_up — given up (the :skip stale policy, or given up before);
    # * :in_progress — another delivery holds a live claim: try again after {#retry_after};
    # * :refused — the record refuses this payload (`on_mismatch: :raise`; normally raised first).
    DECISIONS = %i[ran completed held given_up in_progress refused].freeze

    # @return [Symbol] one of {DECISIONS}
    attr_reader :decision
    # @return [Object, nil] the block's value when it ran; for a replay ({#replayed?}) the
    #   first run's stored value as JSON reads it (String keys); else nil
    attr_reader :value
    # @return [Float, nil] for :in_progress, seconds after which to deliver again: short
    #   at first, doubling with each deferral, never later than the holder's lease end
    #   plus {Configuration#defer_margin}; nil otherwise
    attr_reader :retry_after
    # @return [Float, nil] for :in_progress, seconds until the holder's lease ends
    attr_reader :lease_remaining
    # @return [Claim, nil] the claim this delivery held (:ran, and a takeover that did not run)
    attr_reader :claim
    # @return [String, nil] for :in_progress, the holder's delivery id
    attr_reader :holder
    # @return [Integer, nil] for a duplicate, the record's duplicate count so far
    attr_reader :duplicates
    # @return [Symbol, nil] what became of the result `store_result` asked to keep: :stored,
    #   :too_large or :unencodable (then not stored); nil when no store was requested.
    #   For :ran, this run's; for a replay, the first run's.
    attr_reader :result_state

    # What the delivery came to, for telemetry (the core's labels, `Native::OUTCOMES`):
    # :ran, :reclaimed (ran under a takeover of a stale claim), :replayed (a repeat
    # answered with the stored result), :waited (a repeat that waited for the running
    # call, `wait:`, and found it completed), :skipped (a repeat with no stored value),
    # :in_progress, :held, :given_up, :refused. None of them is an error.
    # @return [Symbol] one of `Native::OUTCOMES`
    attr_reader :label

    # @param decision [Symbol] one of {DECISIONS}
    # @param label [Symbol, nil] the core's label ({#label}); nil: the decision's own name
    # @param waited [Boolean] the delivery waited for a live claim first ({#waited?})
    # @raise [ArgumentError] for another decision
    def initialize(decision, # rubocop:disable Metrics/ParameterLists -- a value object, keywords only
                   value: nil, retry_after: nil, lease_remaining: nil, claim: nil, holder: nil,
                   duplicates: nil, result_state: nil, replayed: false, label: nil, waited: false)
      raise ArgumentError, "unknown decision #{decision.inspect}" unless DECISIONS.include?(decision)

      @decision = decision
      @value = value
      @retry_after = retry_after&.to_f
      @lease_remaining = lease_remaining&.to_f
      @claim = claim
      @holder = holder
      @duplicates = duplicates
      @result_state = result_state
      @replayed = replayed ? true : false
      @label = label || decision
      @waited = waited ? true : false
      freeze
    end

    # @return [Boolean] whether the block ran (and returned)
    def ran?
      @decision == :ran
    end

    # @return [Boolean] whether another delivery holds the operation now
    def in_progress?
      @decision == :in_progress
    end

    # @return [Boolean] whether this is a repeat of a completed operation answered from
    #   its first run's completion, which was made with `store_result` ({#value} is the
    #   stored value when {#result_stored?})
    def replayed?
      @replayed
    end

    # @return [Boolean] whether the delivery waited for a live claim to end (`wait:`)
    #   before this outcome (then a completed operation is labelled :waited)
    def waited?
      @waited
    end

    # @return [Boolean] whether the result was stored: for :ran, this run's value; for a
    #   replay, the first run's (false when it was too large or not JSON, or no store
    #   was requested)
    def result_stored?
      @result_state == :stored
    end
  end
end
