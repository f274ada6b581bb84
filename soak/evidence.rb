# frozen_string_literal: true

module Soak
  # Everything the checker reads, indexed: the idempotency records and ledger rows from
  # the database, the stand-in's effect calls, the workers' journal (claims, failures,
  # completions not recorded), the kills and the PostgreSQL restarts.
  class Evidence
    # Seconds an effect call may reach the stand-in after its worker was SIGKILLed
    # (bytes already in the socket's buffer are still delivered).
    IN_FLIGHT = 1.0
    # Seconds after a PostgreSQL restart during which a lost completion is blamed on it.
    RESTART_GRACE = 15

    # @return [Hash{String => Hash}] records by reference ("status", "claim_token",
    #   "attempts", "takeovers", "duplicates", "resolution", "lease_expired_for", "held_at",
    #   "given_up_at", "last_error")
    attr_reader :records
    # @return [Hash{String => Integer}] soak_ledger rows by operation key
    attr_reader :ledger
    # @return [Array<Hash>] every effect call the stand-in received
    attr_reader :calls
    # @return [Array<Hash>] the journal's entries
    attr_reader :journal

    # @param records [Hash] see {#records}
    # @param ledger [Hash] see {#ledger}
    # @param calls [Array<Hash>] see {#calls}
    # @param journal [Array<Hash>] see {#journal}
    # @param chaos [Chaos] its kills and PostgreSQL restarts
    def initialize(records:, ledger:, calls:, journal:, chaos:)
      @records = records
      @ledger = ledger
      @calls = calls
      @journal = journal
      @chaos = chaos
      @effects = calls.group_by { |call| call["reference"] }
      index_journal
      index_kills
    end

    # @return [Array<Fleet::Kill>]
    def kills
      @chaos.kills
    end

    # @return [Array<Array(Float, Float)>] PostgreSQL restarts, start and end in epoch seconds
    def restarts
      @chaos.restarts
    end

    # @param reference [String]
    # @return [Array<Hash>] the effect calls made for an operation
    def effects(reference)
      @effects.fetch(reference, [])
    end

    # @param worker [String] a worker id
    # @return [Fleet::Kill, nil] the SIGKILL that ended the worker
    def kill_of(worker)
      @kill_of[worker]
    end

    # @param reference [String]
    # @param attempt [Integer]
    # @return [Hash, nil] the journal's claim of an operation's attempt
    def claim(reference, attempt)
      @claims[[reference, attempt]]
    end

    # @param token [String] a claim's fencing token
    # @return [Hash, nil] the body of that claim made its effect but its completion was not
    #   recorded, within a PostgreSQL restart
    def completion_lost_in_restart(token)
      entry = @unrecorded[token]
      entry if entry && restarting?(entry["at"])
    end

    # @param reference [String]
    # @param before [Float] epoch seconds
    # @return [Fleet::Kill, nil] a kill, before `before`, of a worker that had a delivery
    #   of the operation in hand
    def killed_in_hand(reference, before)
      @requeued.fetch(reference, nil)&.find { |kill| kill.at <= before }
    end

    # @param reference [String]
    # @param before [Float] epoch seconds
    # @return [Hash, nil] a delivery of the operation that failed with a connection-class
    #   error while PostgreSQL restarted, before `before`
    def failed_in_restart(reference, before)
      @failures.fetch(reference, []).find do |failure|
        failure["at"] <= before && restarting?(failure["at"]) && LogScan::CONNECTION_ERRORS.match?(
          "#{failure["error"]}: #{failure["message"]}"
        )
      end
    end

    # @param at [Float] epoch seconds
    # @return [Boolean] whether `at` falls in a PostgreSQL restart or the grace after it
    def restarting?(at)
      restarts.any? { |from, to| at >= from - 1 && at <= to + RESTART_GRACE }
    end

    # Why an effect call did not end in its claim's completion.
    # @param call [Hash] an effect call
    # @return [Symbol, nil] :kill (its worker was SIGKILLed after the call, and before the
    #   operation's next claim, when that claim is journaled), :restart (its completion could
    #   not be recorded while PostgreSQL restarted), nil when nothing explains it
    def effect_orphaned_by(call)
      kill = kill_of(call["worker"])
      following = call["attempt"] && claim(call["reference"], call["attempt"] + 1)
      if kill && kill.at >= call["at"] - IN_FLIGHT && (following.nil? || following["at"] >= kill.at)
        :kill
      elsif completion_lost_in_restart(call["token"])
        :restart
      end
    end

    # Why a claim went stale and was taken over: its holder was SIGKILLed, or its
    # completion was lost while PostgreSQL restarted, or (no claim journaled: the
    # worker died or failed before it could note it) its delivery was in the hands of a
    # killed worker or failed on a connection error during the restart.
    # @param reference [String]
    # @param attempt [Integer] the takeover's attempt
    # @param at [Float] when the takeover happened, epoch seconds
    # @return [String, nil] the reason; nil when the holder may have been alive
    def takeover_reason(reference, attempt, at)
      holder = claim(reference, attempt - 1)
      return orphan_reason(reference, at) unless holder

      kill = kill_of(holder["worker"])
      return "holder #{holder["worker"]} SIGKILLed #{format("%.1f", at - kill.at)} s before" if kill && kill.at <= at

      lost = effects(reference).any? do |call|
        call["attempt"] == attempt - 1 && completion_lost_in_restart(call["token"])
      end
      "holder #{holder["worker"]} made the effect; its completion was lost while PostgreSQL restarted" if lost
    end

    private

    def index_journal
      by_kind = @journal.group_by { |entry| entry["kind"] }
      @claims = by_kind.fetch("claimed", []).to_h { |entry| [[entry["reference"], entry["attempt"]], entry] }
      @unrecorded = by_kind.fetch("unrecorded_completion", []).to_h { |entry| [entry["token"], entry] }
      @failures = by_kind.fetch("failed", []).group_by { |entry| entry["reference"] }
    end

    def index_kills
      @kill_of = kills.to_h { |kill| [kill.worker, kill] }
      @requeued = Hash.new { |hash, reference| hash[reference] = [] }
      kills.each { |kill| kill.requeued.each { |reference| @requeued[reference] << kill } }
    end

    def orphan_reason(reference, at)
      if (kill = killed_in_hand(reference, at))
        "claim not journaled; a delivery was in the hands of #{kill.worker} when it was SIGKILLed"
      elsif failed_in_restart(reference, at)
        "claim orphaned by the PostgreSQL restart (its delivery failed with a connection error)"
      end
    end
  end
end
