# frozen_string_literal: true

module Soak
  # Checks every operation of the plan against the evidence, once the queues drained:
  # * same-database (transactional) effects: exactly one ledger row, record completed;
  # * outside effects: under :hold and :skip at most one call, exactly one for a
  #   completed operation; under :reclaim exactly one call by the completing claim, and
  #   every other call made by a claim whose worker was SIGKILLed after the call (or whose
  #   completion was lost while PostgreSQL restarted) — so no more duplicates than kills
  #   that landed after an effect;
  # * no operation lost: each ends completed, held or given up, and each takeover (and so
  #   each hold and give-up) has a reason: its holder was killed, or PostgreSQL restarted;
  # * no record left claimed.
  class Checker
    # The outcome of one operation.
    Result = Struct.new(:operation, :status, :effects, :reason, :violations, :orphaned, keyword_init: true)

    # @return [Array<Result>]
    attr_reader :results

    # @param plan [Plan]
    # @param evidence [Evidence]
    # @param resolutions [Hash{String => Operator::Resolution}] held operations the operator settled
    def initialize(plan, evidence, resolutions)
      @plan = plan
      @evidence = evidence
      @resolutions = resolutions
      @results = plan.operations.map { |operation| check(operation) }
    end

    # @return [Array<String>] every violation, operation by operation, then across operations
    def violations
      @results.flat_map { |r| r.violations.map { |v| "#{r.operation.reference}: #{v}" } } + strays + live_takeovers
    end

    # @return [Hash{Symbol => Array<Hash>}] effect calls that did not end in their claim's
    #   completion, by what explains them (:kill, :restart)
    def orphaned_effects
      @results.flat_map(&:orphaned).group_by(&:first).transform_values { |pairs| pairs.map(&:last) }
    end

    private

    def check(operation)
      record = @evidence.records[operation.reference]
      transactional = JOB_TYPES.fetch(operation.job_class) == :transaction
      effects = transactional ? @evidence.ledger.fetch(operation.key, 0) : @evidence.effects(operation.reference).size
      result = Result.new(operation:, status: record ? record["status"] : "none", effects:, violations: [],
                          orphaned: [])
      if !%w[completed held given_up].include?(result.status)
        result.violations << lost(record)
        result.violations << "#{effects} effects" if effects > 1
      elsif transactional
        transactional(result)
      else
        outside(operation, record, result)
      end
      result
    end

    def lost(record)
      return "lost: no idempotency record (never claimed)" unless record

      detail = "status #{record["status"]}"
      if record["status"] == "claimed"
        detail = "left claimed, its lease ran out #{record["lease_expired_for"]} s ago, no worker holds it"
      end
      "lost: #{detail} (attempts #{record["attempts"]}, last error #{record["last_error"].inspect})"
    end

    def transactional(result)
      result.violations << "status #{result.status} for a transactional operation" if result.status != "completed"
      result.violations << "#{result.effects} ledger rows, expected exactly 1" if result.effects != 1
    end

    def outside(operation, record, result)
      calls = @evidence.effects(operation.reference)
      runner = runner_token(record)
      if runner && (made = calls.count { |call| call["token"] == runner }) != 1
        result.violations << "completed, but its completing claim made #{made} effect calls"
      end
      calls.group_by { |call| call["token"] }.select { |_, same| same.size > 1 }.each do |token, same|
        result.violations << "claim #{token} made the effect #{same.size} times"
      end
      calls.reject { |call| call["token"] == runner }.each { |call| orphaned(call, result) }
      policy(operation, record, result)
    end

    # @return [String, nil] the fencing token of the claim that ran the body to its
    #   completion (none when the operation was held or given up, or a person resolved it as done)
    def runner_token(record)
      record["claim_token"] if record["status"] == "completed" && record["resolution"] != "done"
    end

    def orphaned(call, result)
      cause = @evidence.effect_orphaned_by(call)
      return result.orphaned << [cause, call] if cause

      result.violations << "effect call by attempt #{call["attempt"]} (worker #{call["worker"]}) did not end in a " \
                           "completion, yet its worker was not killed and PostgreSQL was not restarting"
    end

    def policy(operation, record, result)
      policy = JOB_TYPES.fetch(operation.job_class)
      if policy == :reclaim
        result.violations << "status #{result.status} under :reclaim" unless result.status == "completed"
      elsif result.effects > 1
        result.violations << "#{result.effects} effect calls under :#{policy}, expected at most 1"
      elsif record["resolution"] == "done" && result.effects != 1
        result.violations << "resolved as done, yet #{result.effects} effect calls"
      end
      explain_takeover(operation, record, result) if record["takeovers"].positive? || result.status != "completed"
    end

    # The reason for the last takeover: why a held or given-up operation was not run again
    # (for a held operation the operator settled, the takeover that held it).
    def explain_takeover(operation, record, result)
      held = @resolutions[operation.reference]
      attempt = held ? held.attempts : record["attempts"]
      at = held ? held.held_at : (record["given_up_at"] || record["claimed_at"]).to_f
      result.reason = @evidence.takeover_reason(operation.reference, attempt, at)
      return if result.reason || (!held && record["last_claim"] != "takeover")

      result.violations << "taken over (attempt #{attempt}) while its holder may have been alive"
    end

    # Every journaled takeover must have a reason too (not only the last of each operation).
    def live_takeovers
      @evidence.journal.select { |e| e["kind"] == "claimed" && e["claim"] == "takeover" }.filter_map do |e|
        next if @evidence.takeover_reason(e["reference"], e["attempt"], e["at"])

        "#{e["reference"]}: takeover (attempt #{e["attempt"]}, by #{e["worker"]}) while the holder may have been alive"
      end.uniq
    end

    def strays
      known = @plan.operations.to_set(&:reference)
      keys = @plan.operations.to_set(&:key)
      (@evidence.calls.map { |c| c["reference"] }.uniq.reject { |r| known.include?(r) }
                .map { |r| "#{r}: effect calls for an operation the producer never enqueued" }) +
        (@evidence.ledger.keys.reject { |k| keys.include?(k) }.map { |k| "ledger rows for unknown operation #{k}" })
    end
  end
end
