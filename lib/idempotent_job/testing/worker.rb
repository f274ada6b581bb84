# frozen_string_literal: true

require "json"
require "timeout"

module IdempotentJob
  module Testing
    # A forked worker process running one delivery for the kit, talking to it over a
    # pipe: "ready", then either "stopped <point>" (waiting for its SIGKILL) or
    # "result <delivery as JSON>". Internal to the kit.
    class Worker
      # Forks the worker; the block (a delivery) runs in the child.
      # @param replay [Replay] the replay the worker belongs to
      # @param stop_at [Symbol, nil] :claim or :effect to stop there for a SIGKILL
      # @param effect_at [EffectPoint, nil] where the effect ends, when not at the body's end
      # @yieldreturn [Delivery]
      # @return [Worker]
      def self.fork(replay, stop_at: nil, effect_at: nil, &delivery)
        reader, writer = IO.pipe
        pid = Process.fork do
          reader.close
          child(writer, stop_at, effect_at, replay, &delivery)
        end
        writer.close
        new(replay, pid, reader)
      end

      # The child's side: a fresh database connection, the stop point armed, the
      # delivery run and its result written.
      def self.child(writer, stop_at, effect_at, replay)
        writer.sync = true
        # Asked by the kit when the worker stays silent: where are its threads?
        trap("USR2") do
          stacks = Thread.list.map { |t| (t.backtrace || []).first(8).join(" < ") }
          writer.puts("stacks #{stacks.join(" || ")}")
        end
        discard_active_record_connections
        Probe.signal = writer
        Probe.stop_at = (stop_at == :effect && effect_at ? nil : stop_at)
        effect_at&.arm! if stop_at == :effect
        writer.puts("ready")
        delivery = yield
        writer.puts("result #{JSON.generate(delivery.to_h)}")
        exit!(0)
      rescue Exception => e # rubocop:disable Lint/RescueException -- everything goes to the kit
        writer.puts("error #{replay.job_class}: #{e.class}: #{e.message}".tr("\n", " "))
        exit!(1)
      end

      # A forked child must not use the parent's ActiveRecord sockets. ActiveRecord
      # 6.1 and later discard them by themselves after a fork (ActiveSupport::ForkTracker).
      def self.discard_active_record_connections
        return unless defined?(::ActiveRecord::Base) && !defined?(::ActiveSupport::ForkTracker)

        ::ActiveRecord::Base.connection_handler.connection_pool_list.each(&:discard!)
      end

      # See {Worker.fork}, which builds it in the parent.
      # @param replay [Replay] the replay the worker belongs to (its job class names errors)
      # @param pid [Integer] the forked worker's process id
      # @param reader [IO] the parent's end of the worker's pipe
      def initialize(replay, pid, reader)
        @replay = replay
        @pid = pid
        @reader = reader
      end

      # Waits for the worker's "ready" (forked, connected, about to deliver).
      # @raise [Error] when it said something else or nothing in time
      def wait_ready
        line = next_line
        return if line == "ready"

        raise Error, "#{@replay.job_class}: expected the worker process to say \"ready\", it said #{line.inspect}"
      end

      # Waits for the worker to stop at `point`, then SIGKILLs it.
      # @param point [Symbol] :claim or :effect
      # @return [Delivery, nil] nil once killed there; the worker's delivery when it
      #   finished (or raised) without reaching the point
      # @raise [Error] when the worker failed outside its delivery or hung
      def kill_at_stop!(point)
        wait_ready
        line = next_line
        return nil if line == "stopped #{point}"
        return delivery_from(JSON.parse(line.delete_prefix("result "))) if line.start_with?("result ")

        raise Error, "#{@replay.job_class}: expected the worker process to stop at its #{point}, it said " \
                     "#{line.inspect}"
      ensure
        terminate!
      end

      # @return [Delivery] what the worker's delivery did
      # @raise [Error] when the worker failed or hung
      def result
        line = next_line
        raise Error, "#{@replay.job_class}: a worker process said #{line.inspect}" unless line.start_with?("result ")

        delivery_from(JSON.parse(line.delete_prefix("result ")))
      ensure
        terminate!
      end

      # SIGKILLs the worker if it still runs, reaps it and closes its pipe. Idempotent.
      # @return [void]
      def terminate!
        begin
          Process.kill(:KILL, @pid)
        rescue Errno::ESRCH
          nil
        end
        begin
          Process.wait(@pid)
        rescue Errno::ECHILD
          nil
        end
        @reader.close unless @reader.closed?
      end

      private

      def next_line
        line = Timeout.timeout(Replay::WORKER_TIMEOUT) { @reader.gets }
        raise Error, "#{@replay.job_class}: a worker process exited without a word" if line.nil?

        line.chomp
      rescue Timeout::Error
        raise Error, "#{@replay.job_class}: a worker process (pid #{@pid}) said nothing for " \
                     "#{Replay::WORKER_TIMEOUT} s; #{stacks}"
      end

      # The silent worker's Ruby stacks (it answers SIGUSR2 unless stuck outside Ruby).
      def stacks
        Process.kill(:USR2, @pid)
        line = Timeout.timeout(5) { @reader.gets }
        line ? "its threads: #{line.chomp.delete_prefix("stacks ")}" : "it exited"
      rescue Timeout::Error
        "it did not answer SIGUSR2 either (stuck outside Ruby, e.g. in native code holding the GVL)"
      rescue Errno::ESRCH
        "it is gone"
      end

      def delivery_from(hash)
        Delivery.new(label: hash["label"], jid: hash["jid"], outcome: hash["outcome"].to_sym, ran: hash["ran"],
                     decision: hash["decision"]&.to_sym, lookup: hash["lookup"]&.to_sym, error: hash["error"],
                     deferred: hash["deferred"] || [])
      end
    end

    # Where a worker killed "after the effect" dies: as a named method returns
    # ("Gateway#charge" for an instance method, "Gateway.charge" for a class method).
    class EffectPoint
      # @param text [String] "Class#method" or "Class.method"
      # @return [EffectPoint]
      # @raise [ArgumentError] when the text is malformed or names no such method
      def self.parse(text)
        match = /\A(?<owner>[A-Z][\w:]*)(?<sep>[#.])(?<name>\w+[?!]?)\z/.match(text.to_s)
        raise ArgumentError, "effect_at must look like \"Class#method\" or \"Class.method\", got #{text.inspect}" unless
          match

        owner = Object.const_get(match[:owner])
        target = match[:sep] == "#" ? owner : owner.singleton_class
        name = match[:name].to_sym
        unless target.method_defined?(name) || target.private_method_defined?(name)
          raise ArgumentError, "effect_at: #{text} is not a method"
        end

        new(text.to_s, target, name)
      rescue NameError => e
        raise ArgumentError, "effect_at: #{text}: #{e.message}"
      end

      # See {EffectPoint.parse}, which checks the method exists.
      # @param text [String] "Class#method" or "Class.method", as given
      # @param target [Module] the class (instance method) or its singleton class (class method)
      # @param name [Symbol] the method's name
      def initialize(text, target, name)
        @text = text
        @target = target
        @name = name
      end

      # In a worker to be killed: the method, once it returns, stops the worker.
      # @return [void]
      def arm!
        name = @name
        @target.prepend(Module.new do
          define_method(name) do |*args, **kwargs, &block|
            super(*args, **kwargs, &block).tap { Probe.stop!(:effect) }
          end
        end)
      end

      # @return [String] as given
      def to_s
        @text
      end
    end
  end
end
