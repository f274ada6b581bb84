# frozen_string_literal: true

require "spec_helper"

# The reclaim budget (`idempotency_max_takeovers:`, issue 34) through the Sidekiq server
# middleware in real worker processes: a body that SIGKILLs its own process every time (a
# poison operation: out of memory, a segfault in a C extension) is reclaimed at every
# lease end under :reclaim; with a budget of 2 it runs three times (the first claim and
# two takeovers) and the next stale claim holds the operation for a person, saying why.
# The control without a budget keeps running it.
RSpec.describe "The reclaim budget" do
  let(:lease) { 1.0 }

  # One delivery of `job` in a forked worker whose body kills its own process.
  # @return [Symbol] :killed when the body ran (and killed the worker), else :survived
  def deliver_poison(job)
    pid, reader = fork_worker do |pipe|
      SpecHooks.on(:before_effect) do
        pipe.puts("started")
        Process.kill(:KILL, Process.pid)
      end
      deliver(job)
      pipe.puts("survived")
    end
    line = read_line(reader, timeout: 30)
    status = wait_child(pid)
    line == "started" && status.signaled? && status.termsig == Signal.list["KILL"] ? :killed : :survived
  end

  # Delivers `job` again and again, as Sidekiq redelivers a job whose process died,
  # letting each killed claim's lease run out first.
  def redeliver(job, times)
    Array.new(times) do
      outcome = deliver_poison(job)
      wait_for_lease_end(lease) if outcome == :killed
      outcome
    end
  end

  def poison_job(**options)
    job_hash(["poison-#{SecureRandom.hex(4)}", 1],
             "idempotency_lease" => lease, "idempotency_on_stale" => "reclaim", **options)
  end

  it "holds a poison operation after max_takeovers stale takeovers instead of looping" do
    job = poison_job("idempotency_max_takeovers" => 2)
    seen = redeliver(job, 5)
    expect(seen).to eq(%i[killed killed killed survived survived])
    held = record(job["args"].first)
    expect(held).to have_attributes(status: :held, attempts: 4, takeovers: 3)
    expect(held.last_error).to eq("the reclaim budget is spent: 3 stale takeovers of this operation, " \
                                  "max_takeovers 2")
    expect(IdempotentJob.held.map(&:operation_key)).to include(job["args"].first)
    expect(Effects.count(job["args"].first)).to eq(0)
  end

  it "without a budget keeps reclaiming the poison operation (the control)" do
    job = poison_job
    expect(redeliver(job, 5)).to eq([:killed] * 5)
    expect(record(job["args"].first)).to have_attributes(status: :claimed, takeovers: 4)
  end
end
