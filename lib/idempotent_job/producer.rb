# frozen_string_literal: true

module IdempotentJob
  # Who enqueued a job: the producer identity a door stamps on a job at enqueue time (the
  # Sidekiq client middleware, the ActiveJob door's enqueue), carried with the job and
  # recorded with each repeat, so the repeats report can tell a re-enqueue by the same
  # producer from one by another ("OrdersController#create and StripeWebhook#handle both
  # enqueue ChargeOrderJob for the same order").
  #
  # By default the producer is the first caller frame outside the gem, the queue library
  # and Ruby's own, relative to the working directory (the app's root), e.g.
  # `app/controllers/orders_controller.rb:42`. An app names producers itself with
  # {with} around an enqueue (`Producer.with("StripeWebhook#handle") { job.perform_async(id) }`)
  # or with {resolver=} for every enqueue.
  module Producer
    # The payload key a door stores the producer under.
    KEY = Delivery::PRODUCER
    # Longest producer kept, in characters.
    MAX_LENGTH = 200
    # Libraries whose frames are never the producer (their loaded gems' directories).
    LIBRARIES = %w[sidekiq activejob activesupport activerecord globalid railties actionpack redis redis-client
                   connection_pool delayed_job delayed_job_active_record].freeze

    @resolver = nil
    @ignored = []

    class << self
      # Paths (absolute, or relative to the working directory) whose frames are never the
      # producer either: the app's own enqueue helpers, e.g. `"app/lib/enqueue.rb"`.
      # @return [Array<String>]
      attr_reader :ignored

      # A callable returning the producer of the enqueue in progress (or nil to fall
      # back to the caller frame); nil to use only the caller frame.
      # @return [#call, nil]
      attr_accessor :resolver

      # The producer to stamp on a job being enqueued now: the innermost {with} value,
      # else the {resolver}'s answer, else the first caller frame outside the libraries.
      # @return [String, nil] at most {MAX_LENGTH} characters; nil when no frame qualifies
      def current
        name = Thread.current[:idempotent_job_producer] || resolver&.call || caller_frame
        name&.to_s&.[](0, MAX_LENGTH)
      end

      # Names the producer of every enqueue in the block (on this thread).
      # @param name [String] e.g. "StripeWebhook#handle"
      # @return [Object] the block's value
      def with(name)
        previous = Thread.current[:idempotent_job_producer]
        Thread.current[:idempotent_job_producer] = name.to_s
        yield
      ensure
        Thread.current[:idempotent_job_producer] = previous
      end

      # Stamps `payload` (a job hash) with {current} unless it already has a producer
      # (a retry or a re-push of a job keeps the producer of its first enqueue).
      # @param payload [Hash{String => Object}] the job's payload, changed in place
      # @return [Hash] the payload
      def stamp(payload)
        payload[KEY] ||= current
        payload.delete(KEY) if payload[KEY].nil?
        payload
      end

      # The first caller frame outside the gem, the queue libraries and Ruby's own files.
      # Frames are read in batches (16, then 32 more, …, 200 at most): the app's frame is
      # usually a few frames above the enqueue.
      # @return [String, nil] "path:line" relative to the working directory
      def caller_frame
        skip = library_roots + ignored.map { |path| File.expand_path(path) }
        start = 2
        [16, 32, 64, 88].each do |count|
          frames = caller_locations(start, count) or return nil
          frame = frames.find { |loc| outside?(loc, skip) }
          return "#{relative(frame.absolute_path || frame.path)}:#{frame.lineno}" if frame
          return nil if frames.size < count

          start += count
        end
        nil
      end

      private

      # The gem's own lib, Ruby's standard library and the loaded queue libraries; worked
      # out again when more gems have been loaded since.
      def library_roots
        loaded = Gem.loaded_specs.size
        return @roots if @roots_for == loaded

        roots = ["#{File.expand_path("..", __dir__)}#{File::SEPARATOR}", RbConfig::CONFIG["rubylibdir"]]
        LIBRARIES.each { |name| roots << Gem.loaded_specs[name]&.full_gem_path }
        @roots_for = loaded
        @roots = roots.compact.uniq.freeze
      end

      def outside?(location, skip)
        path = location.absolute_path || location.path
        !path.start_with?("<internal:") && skip.none? { |root| path.start_with?(root) }
      end

      def relative(path)
        root = "#{Dir.pwd}#{File::SEPARATOR}"
        path.start_with?(root) ? path.delete_prefix(root) : path
      end
    end
  end
end
