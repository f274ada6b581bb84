# frozen_string_literal: true

require "sidekiq"

module Soak
  # Enqueues the plan's deliveries with Sidekiq::Client, as an application would, each
  # at its planned moment of the run.
  class Producer
    # @return [Hash{String => Integer}] deliveries enqueued per operation reference
    attr_reader :deliveries

    # @param plan [Plan]
    def initialize(plan)
      @plan = plan
      @deliveries = Hash.new(0)
      @stopped = false
    end

    # Pushes every planned delivery at its time; returns when all are pushed or {stop}
    # was called.
    # @param started_at [Float] the run's start, monotonic seconds
    # @return [void]
    # @raise [Redis::BaseError] when Redis refuses a push
    def run(started_at)
      @plan.pushes.each do |push|
        wait = started_at + push.at - Soak.monotonic
        sleep(wait) if wait.positive?
        break if @stopped

        deliver(push)
      end
    end

    # Makes {run} return before its next push.
    # @return [void]
    def stop
      @stopped = true
    end

    # @return [Integer] deliveries enqueued so far
    def total
      @deliveries.values.sum
    end

    private

    def deliver(push)
      operation = push.operation
      payload = { "class" => operation.job_class, "queue" => QUEUE }
      if push.kind == :concurrent
        ::Sidekiq::Client.push_bulk(payload.merge("args" => Array.new(push.copies) { operation.args }))
      else
        push.copies.times { ::Sidekiq::Client.push(payload.merge("args" => operation.args)) }
      end
      @deliveries[operation.reference] += push.copies
    end
  end
end
