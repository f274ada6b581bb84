# frozen_string_literal: true

require "spec_helper"
require "rbconfig"
require "timeout"

# The first objects of the extension's wrapped classes, made by several threads at once
# (a multi-threaded worker's first deliveries: each builds its Native::Protocol, each
# running body hands a Native::HeartbeatReader to the heartbeat watch). magnus finds a
# wrapped class's Ruby class lazily, by calling `Object.const_get(name)` inside a Rust
# `OnceLock`; a thread switched out during that call (Ruby may switch at its end) holds
# the lock, and the next thread wrapping the same class waited on it holding the GVL: the
# whole process froze, signals included. The extension now looks every wrapped class up
# while it loads. Each run is a fresh process (the lookup happens once per process), with
# `Object.const_get` slowed down for the extension's class names so that a second thread
# arrives while the first is inside it; a frozen child is killed after a bounded wait.
RSpec.describe "The extension's wrapped classes, first used by several threads at once", :faults do
  # Loads the gem, slows `Object.const_get` of `IdempotentJob::Native::*` down (a sleep:
  # the GVL goes to the next thread), builds a Native::Protocol and a Native::Store in
  # thread A, then in thread B once A is inside that lookup (or done without it), and
  # prints the Native class names looked up after the gem loaded, then "built".
  let(:child) do
    <<~'RUBY'
      require "idempotent_job"
      looked_up = Queue.new
      Object.singleton_class.prepend(Module.new do
        define_method(:const_get) do |name, *rest|
          if name.to_s.start_with?("IdempotentJob::Native::")
            looked_up << name.to_s
            sleep 0.3
          end
          super(name, *rest)
        end
      end)
      build = lambda do
        IdempotentJob::Native::Protocol.new("Spec::FirstWrap", {}, 1.0)
        IdempotentJob::Native::Store.new(JSON.generate(database_url: "postgres://spec@127.0.0.1:1/spec"))
      end
      first = Thread.new { build.call.tap { looked_up << :done } }
      looked_up.pop # thread A is inside the lookup, or finished without one
      second = Thread.new { build.call }
      [first, second].each(&:join)
      names = []
      names << looked_up.pop until looked_up.empty?
      puts "looked up after load: #{names.grep(String).uniq.sort.join(",")}"
      puts "built"
    RUBY
  end

  it "two threads making the first Protocol and Store objects both finish; no class is looked up after load" do
    reader, writer = IO.pipe
    pid = Process.spawn(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-rjson", "-e", child,
                        out: writer, err: writer)
    writer.close
    status = begin
      Timeout.timeout(60) { Process.wait2(pid)[1] }
    rescue Timeout::Error
      nil # frozen: every thread waits on the GVL or on the lookup's lock
    end
    output = reader.read_nonblock(65_536, exception: false)
    output = "" unless output.is_a?(String)
    expect(status).not_to be_nil, "the child froze (killed after 60 s); its output: #{output.inspect}"
    expect(status).to be_success
    expect(output).to include("looked up after load: \n").and include("built")
  ensure
    reader&.close
    Process.kill(:KILL, pid) if pid && status.nil?
    Process.wait(pid) if pid && status.nil?
  end
end
