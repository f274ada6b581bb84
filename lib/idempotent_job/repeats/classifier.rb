# frozen_string_literal: true

require "time"

module IdempotentJob
  module Repeats
    # Classifies each repeat of an operation from the facts recorded with it — a pure
    # function: no database, no clock. A delivery's facts (a Hash with String keys, as
    # the doors record them) are:
    # * "at" (Float, epoch seconds by the database clock): when it reached the claim;
    # * "jid" (String): its delivery id (Sidekiq jid; "job_id" for ActiveJob, "task_id"
    #   for the Celery door, or "delivery_id" / "message_id", are read too);
    # * "retry_count" (Integer, Sidekiq: absent before the queue's first retry),
    #   "executions" (Integer, ActiveJob: 1 on the first run, 2 on the first retry) or
    #   "retries" (Integer, Celery: 0 on the first run, 1 on the first retry);
    # * "enqueued_at" / "created_at" (Float epoch seconds; Sidekiq 8's integer
    #   milliseconds and ActiveJob's ISO 8601 text are read as such too);
    # * "deferrals" (Integer): how many times the gem deferred this copy already;
    # * "producer" (String): who enqueued it ({IdempotentJob::Producer});
    # * "decision" (String): what the claim statement answered it — "claimed" (a first
    #   claim or a retry's), "takeover" (it took over an expired lease), "in_progress"
    #   (it met a live claim), "completed", "held", "given_up", "refused".
    #
    # A delivery met a live claim when it was answered "in_progress", or answered
    # "completed" although it arrived before the operation completed (it waited on the
    # record's row lock for a transactional claim's commit).
    #
    # Causes, in the order they are tried:
    # * :queue_retry — the same delivery again with more retries (retry_count or
    #   executions): the queue's retry after the job raised;
    # * :redelivery — the same delivery again without a new retry, or any delivery that
    #   took over an expired lease: work redone after a worker died (a crash, a restart,
    #   a deploy; `restart` names the recorded deploy/restart it follows within the window,
    #   when that restart came after the claim it redoes);
    # * :concurrent_copy — another delivery that met a live claim;
    # * :re_enqueue_same_producer / :re_enqueue_other_producer — another delivery after
    #   the claim ended, enqueued by a producer seen before for this operation, or not;
    # * :re_enqueue — the same, with no producer recorded to compare;
    # * :unknown — no facts were recorded with it (a record kept before the upgrade) and
    #   it came after the completion (one that came before overlapped the claim: a
    #   concurrent copy, as a transactional claim's copies waiting on its row lock are).
    # A copy the gem deferred that comes back (same id, deferrals above 0) is not a new
    # repeat: it keeps the cause of its id's first arrival, with `deferred_return: true`.
    module Classifier
      # Every cause, in report order.
      CAUSES = %i[concurrent_copy queue_retry redelivery re_enqueue_same_producer re_enqueue_other_producer
                  re_enqueue unknown].freeze
      # How each cause reads in a report.
      LABELS = { concurrent_copy: "concurrent copy", queue_retry: "queue retry", redelivery: "redelivery/restart",
                 re_enqueue_same_producer: "re-enqueue, same producer",
                 re_enqueue_other_producer: "re-enqueue, other producer", re_enqueue: "re-enqueue",
                 unknown: "no facts recorded" }.freeze
      # Decisions of a delivery that won the claim.
      WON = %w[claimed takeover].freeze
      # Epoch values at or above this are milliseconds (year 5138 in seconds).
      MILLISECONDS_FROM = 100_000_000_000

      # One classified repeat.
      # Members: at (Time), id (String), cause (Symbol of {CAUSES}), after_claim (Float
      # seconds since the operation's first claim), after_enqueue (Float seconds since its
      # own enqueue, nil when unknown), retry_count (the queue's retries before this one:
      # Sidekiq's retry_count, ActiveJob's executions - 1), producer, first_producer, live_claim
      # (Boolean: it met a live claim), deferred_return (Boolean), restart (Time of the
      # matching deploy/restart, or nil), decision (String).
      Repeat = Struct.new(:at, :id, :cause, :after_claim, :after_enqueue, :retry_count, :producer, :first_producer,
                          :live_claim, :deferred_return, :restart, :decision, keyword_init: true)

      class << self
        # @param deliveries [Array<Hash{String => Object}>] an operation's deliveries in
        #   arrival order, the first claim's first (facts as described above)
        # @param completed_at [Time, nil] when the operation completed (a "completed"
        #   answer to a delivery that arrived earlier means it waited for that commit)
        # @param restarts [Array<Time>] recorded deploy/restart times
        # @param restart_window [Numeric] seconds after a restart within which a redelivery
        #   is matched to it
        # @return [Array<Repeat>] one per delivery after the first
        def classify(deliveries, completed_at: nil, restarts: [], restart_window: 120)
          first = deliveries.first or return []
          context = { claimed_at: seconds(first["at"]), completed_at: completed_at&.to_f,
                      producers: [first["producer"]].compact, seen: {} } # seen: id => [latest facts, first cause]
          context[:seen][id_of(first)] = [first, nil] if id_of(first)
          claims = [] # per repeat: when the claim before it was won
          won = seconds(first["at"])
          repeats = deliveries.drop(1).map do |facts|
            claims << won
            won = seconds(facts["at"]) || won if WON.include?(facts["decision"])
            classify_one(facts, context).tap { |repeat| remember(context, facts, repeat, first) }
          end
          took_over(repeats)
          match_restarts(repeats, claims, restarts, restart_window)
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

        # @param value [Numeric, String, Time, nil] epoch seconds, epoch milliseconds
        #   (Sidekiq 8), ISO 8601 text (ActiveJob's enqueued_at, the record's times) or a Time
        # @return [Float, nil] epoch seconds (nil for anything else)
        def seconds(value)
          case value
          when Numeric then value >= MILLISECONDS_FROM ? value / 1000.0 : value.to_f
          when Time then value.to_f
          when String then Time.iso8601(value).to_f
          end
        rescue ArgumentError
          nil
        end

        private

        def classify_one(facts, context)
          at = seconds(facts["at"])
          earlier, first_cause = context[:seen][id_of(facts)]
          live = live_claim?(facts, at, context[:completed_at])
          cause, returned = cause_of(facts, earlier, first_cause, live, context[:producers])
          enqueued = seconds(facts["enqueued_at"]) || seconds(facts["created_at"])
          Repeat.new(at: at && Time.at(at), id: id_of(facts), cause:, after_claim: since(at, context[:claimed_at]),
                     after_enqueue: since(at, enqueued), retry_count: facts["retry_count"] || facts["executions"]&.-(1),
                     producer: facts["producer"], live_claim: live, deferred_return: returned,
                     decision: facts["decision"])
        end

        # Answered "in progress", or answered "completed" (or recorded without facts, as a
        # transactional claim's copies are) although it arrived before the completion.
        def live_claim?(facts, at, completed_at)
          facts["decision"] == "in_progress" ||
            (%w[completed].include?(facts.fetch("decision", "completed")) && !at.nil? && !completed_at.nil? &&
             at < completed_at)
        end

        # [cause, deferred_return]
        def cause_of(facts, earlier, first_cause, live, producers)
          return [live ? :concurrent_copy : :unknown, false] unless facts.key?("decision")
          return [other_delivery(facts, live, producers), false] unless earlier
          return [:queue_retry, false] if retries(facts) > retries(earlier)
          return [first_cause || :concurrent_copy, true] if facts["deferrals"].to_i.positive?

          [:redelivery, false]
        end

        def other_delivery(facts, live, producers)
          return :concurrent_copy if live
          return :re_enqueue if facts["producer"].nil? || producers.empty?

          producers.include?(facts["producer"]) ? :re_enqueue_same_producer : :re_enqueue_other_producer
        end

        def remember(context, facts, repeat, first)
          id = id_of(facts)
          context[:seen][id] = [facts, context[:seen].dig(id, 1) || repeat.cause] if id
          context[:producers] |= [facts["producer"]] if facts["producer"]
          repeat.first_producer = first["producer"]
        end

        # A delivery that took over an expired lease redid a dead worker's claim: it and
        # its earlier arrivals (a copy deferred behind that claim until the lease ran out)
        # are redeliveries.
        def took_over(repeats)
          repeats.select { |r| r.decision == "takeover" }.each do |taker|
            chain = taker.id ? repeats.select { |r| r.id == taker.id && r.cause != :queue_retry } : [taker]
            chain.each { |r| r.cause = :redelivery }
          end
        end

        # Each redelivery (deferred returns aside) is matched to the restart it follows,
        # among those after the claim it redoes (`claims`: per repeat, when the claim before
        # it was won): a restart before that claim did not cause this delivery.
        def match_restarts(repeats, claims, restarts, window)
          repeats.zip(claims).each do |r, claimed|
            next unless r.cause == :redelivery && !r.deferred_return

            r.restart = restart_near(r.at&.to_f, claimed, restarts, window)
          end
          repeats
        end

        # The delivery id, whichever door recorded it.
        def id_of(facts)
          facts["jid"] || facts["job_id"] || facts["task_id"] || facts["delivery_id"] || facts["message_id"]
        end

        # How many times the queue has retried this delivery: Sidekiq's retry_count is
        # absent before the first retry, then 0, 1…; ActiveJob's executions is 1, 2…;
        # Celery's retries is 0, 1…
        def retries(facts)
          return facts["retry_count"].to_i + 1 if facts.key?("retry_count")
          return facts["retries"].to_i if facts.key?("retries")

          [facts["executions"].to_i - 1, 0].max
        end

        def since(at, start)
          at && start && (at - start)
        end

        def restart_near(at, claimed, restarts, window)
          return nil unless at

          restarts.select { |r| at >= r.to_f && at - r.to_f <= window && (claimed.nil? || r.to_f > claimed) }.max
        end
      end
    end
  end
end
