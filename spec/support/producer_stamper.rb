# frozen_string_literal: true

# A Sidekiq client middleware stamping the producer, as a door's does (its frame is
# ignored, as the gem's own are).
class ProducerStamper
  def call(_job_class, job, _queue, _redis_pool = nil)
    IdempotentJob::Producer.stamp(job)
    yield
  end
end
