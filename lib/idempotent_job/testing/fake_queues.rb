# frozen_string_literal: true

module IdempotentJob
  module Testing
    # Sidekiq's fake queues around a scenario: what the kit and the job body push
    # there during it is taken out again, leaving the suite's own jobs as they were.
    # Internal to the kit.
    module FakeQueues
      class << self
        # @return [Array(Hash, Hash)] copies of the by-queue and by-class maps
        def snapshot
          [by_queue.transform_values(&:dup), by_class.transform_values(&:dup)]
        end

        # @param saved [Array(Hash, Hash)] a {snapshot}
        # @return [Array<Hash>] payloads pushed since, other than the kit's own
        #   deliveries and the gem's pushed-back copies
        def added_since(saved)
          before = {}.compare_by_identity
          saved.first.each_value { |jobs| jobs.each { |job| before[job] = true } }
          by_queue.values.flatten.reject do |job|
            before.key?(job) || job["idempotency_deferrals"] || job.key?("idempotency_lease")
          end
        end

        # @param class_name [String] a job class name
        # @return [Array<Hash>] the fake queues' payloads of that class (the live array)
        def of_class(class_name)
          by_class[class_name]
        end

        # Puts the maps back as they were at {snapshot}.
        # @param saved [Array(Hash, Hash)]
        # @return [void]
        def restore(saved)
          [by_queue, by_class].zip(saved).each do |map, copy|
            map.clear
            copy.each { |name, jobs| map[name] = jobs }
          end
        end

        private

        def by_queue
          ::Sidekiq::Queues.jobs_by_queue
        end

        def by_class
          SidekiqCompat.fake_jobs_by_class
        end
      end
    end
  end
end
