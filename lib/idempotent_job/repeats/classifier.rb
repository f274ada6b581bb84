# frozen_string_literal: true

module IdempotentJob
  module Repeats
    # Classifies each repeat of an operation from the facts recorded with it — a pure
    # function: no database, no clock. A delivery's facts (a Hash with String keys, as
    # the doors record them) are:
    # * "at" (Float, epoch seconds by the database clock): when it reached the claim;
    # * "jid" (String): its delivery id (Sidekiq jid, ActiveJob job_id, message id);
    # * "retry_count" (Integer, absent before the queue's first retry);
    # * "enqueued_at" / "created_at" (Float epoch seconds: Sidekiq 8's integer
    #   milliseconds are read as such too);
    # * "deferrals" (Integer): how many times the gem deferred this copy already;
    # * "producer" (String): who enqueued it ({IdempotentJob::Producer});
    # * "decision" (String): what the claim statement answered it — "claimed",
    #   "in_progress" (it met a live claim), "completed", "held", "given_up", "refused".
    #
    # Causes, in the order they are tried:
    # * :queue_retry — the same delivery again with a higher retry_count: the queue's
    #   retry after the job raised;
    # * :redelivery — the same delivery again without a new retry: redelivered after a
    #   crash or restart (`restart:` names the recorded deploy/restart it falls near);
    # * :concurrent_copy — another delivery that met a live claim: a copy running at
    #   the same time as the claim's;
    # * :re_enqueue_same_producer / :re_enqueue_other_producer — another delivery after
    #   the claim ended, enqueued by a producer seen before for this operation, or not;
    # * :re_enqueue — the same, with no producer recorded to compare.
    # A copy the gem deferred that comes back (same id, more deferrals) is not a new
    # repeat: it keeps the cause of its first arrival, with `deferred_return: true`.
    module Classifier
      # Every cause, in report order.
      CAUSES = %i[concurrent_copy queue_retry redelivery re_enqueue_same_producer re_enqueue_other_producer
                  re_enqueue].freeze
      # How each cause reads in a report.
      LABELS = { concurrent_copy: "concurrent copy", queue_retry: "queue retry", redelivery: "redelivery/restart",
                 re_enqueue_same_producer: "re-enqueue, same producer",
                 re_enqueue_other_producer: "re-enqueue, other producer", re_enqueue: "re-enqueue" }.freeze
      # Epoch values at or above this are milliseconds (year 5138 in seconds).
      MILLISECONDS_FROM = 100_000_000_000

      # One classified repeat.
      # Members: at (Time), id (String), cause (Symbol of {CAUSES}), after_claim (Float
      # seconds since the operation's first claim), after_enqueue (Float seconds since its
      # own enqueue, nil when unknown), retry_count, producer, first_producer, live_claim
      # (Boolean), deferred_return (Boolean), restart (Time of the matching deploy/restart,
      # or nil), decision (String).
      Repeat = Struct.new(:at, :id, :cause, :after_claim, :after_enqueue, :retry_count, :producer, :first_producer,
                          :live_claim, :deferred_return, :restart, :decision, keyword_init: true)

      class << self
        # @param deliveries [Array<Hash{String => Object}>] an operation's deliveries in
        #   arrival order, the first claim's first (facts as described above)
        # @param restarts [Array<Time>] recorded deploy/restart times
        # @param restart_window [Numeric] seconds after a restart within which a redelivery
        #   is matched to it
        # @return [Array<Repeat>] one per delivery after the first
        def classify(deliveries, restarts: [], restart_window: 120)
          first = deliveries.first or return []
          claimed_at = seconds(first["at"])
          seen = {} # id => [facts of its latest arrival, cause of its first]
          seen[first["jid"]] = [first, nil] if first["jid"]
          producers = [first["producer"]].compact
          deliveries.drop(1).map do |facts|
            repeat = classify_one(facts, seen, producers, claimed_at, [restarts, restart_window])
            seen[facts["jid"]] = [facts, seen.dig(facts["jid"], 1) || repeat.cause] if facts["jid"]
            producers |= [facts["producer"]] if facts["producer"]
            repeat.first_producer = first["producer"]
            repeat
          end
        end

        # @param operations [Array<#job_type, #producers>] operations with the producers
        #   that enqueued them (Array of String)
        # @return [Hash{Array(String, String, String) => Integer}] per [job_type, producer
        #   a, producer b] (a < b), how many operations both enqueued; most first
        def producer_pairs(operations)
          pairs = Hash.new(0)
          operations.each do |op|
            op.producers.compact.uniq.sort.combination(2).each { |a, b| pairs[[op.job_type, a, b]] += 1 }
          end
          pairs.sort_by { |key, count| [-count, key] }.to_h
        end

        # @param value [Numeric, nil] epoch seconds, or milliseconds (Sidekiq 8)
        # @return [Float, nil] epoch seconds
        def seconds(value)
          return nil unless value.is_a?(Numeric)

          value >= MILLISECONDS_FROM ? value / 1000.0 : value.to_f
        end

        private

        def classify_one(facts, seen, producers, claimed_at, (restarts, window))
          at = seconds(facts["at"])
          earlier, first_cause = seen[facts["jid"]]
          cause, returned = cause_of(facts, earlier, first_cause, producers)
          enqueued = seconds(facts["enqueued_at"]) || seconds(facts["created_at"])
          Repeat.new(at: at && Time.at(at), id: facts["jid"], cause:, after_claim: since(at, claimed_at),
                     after_enqueue: since(at, enqueued), retry_count: facts["retry_count"],
                     producer: facts["producer"], live_claim: facts["decision"] == "in_progress",
                     deferred_return: returned, decision: facts["decision"],
                     restart: cause == :redelivery && !returned ? restart_near(at, restarts, window) : nil)
        end

        def since(at, start)
          at && start && (at - start)
        end

        # [cause, deferred_return]
        def cause_of(facts, earlier, first_cause, producers)
          return [other_delivery(facts, producers), false] unless earlier
          return [:queue_retry, false] if facts["retry_count"].to_i > earlier["retry_count"].to_i ||
                                          (facts.key?("retry_count") && !earlier.key?("retry_count"))
          return [first_cause || :concurrent_copy, true] if facts["deferrals"].to_i > earlier["deferrals"].to_i

          [:redelivery, false]
        end

        def other_delivery(facts, producers)
          return :concurrent_copy if facts["decision"] == "in_progress"
          return :re_enqueue if facts["producer"].nil? || producers.empty?

          producers.include?(facts["producer"]) ? :re_enqueue_same_producer : :re_enqueue_other_producer
        end

        def restart_near(at, restarts, window)
          return nil unless at

          restarts.select { |r| at >= r.to_f && at - r.to_f <= window }.max
        end
      end
    end
  end
end
