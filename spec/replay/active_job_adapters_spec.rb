# frozen_string_literal: true

require "spec_helper"
require_relative "../support/active_job_jobs"
require_relative "../support/active_job_workers"
require_relative "../support/active_job_scenarios"

# The five replay scenarios through ActiveJob's in-process adapters, :inline (a copy
# that meets a live claim waits in the caller) and :async (such a copy is re-enqueued
# with retry_job(wait:)), each with its control: the same job without the gem.
RSpec.describe "ActiveJob on the inline and async adapters" do
  before(:context) { SpecOrder.setup! }

  %i[inline async].each do |adapter|
    describe adapter.to_s do
      let(:driver) { ActiveJobWorkers::InProcess.new(adapter) }

      it_behaves_like "ActiveJob replays through real workers", concurrent_workers: :threads
    end
  end

  describe "inline, 2 deliveries at once from two processes" do
    around { |example| with_adapter(:inline) { example.run } }

    def race_processes
      data = AjChargeOrderJob.new(44, 100, 0.5).serialize
      gate_reader, gate_writer = IO.pipe
      children = Array.new(2) do
        fork_worker do |pipe|
          gate_writer.close
          gate_reader.read(1)
          ActiveJob::Base.execute(data)
          pipe.puts("done")
        end
      end
      gate_reader.close
      sleep 0.2
      gate_writer.close
      children.each do |pid, reader|
        expect(read_line(reader)).to eq("done")
        expect(wait_child(pid)).to be_success
      end
    end

    it "one runs, the other waits in place and is skipped" do
      race_processes
      expect(Effects.count(44)).to eq(1)
      record = IdempotentJob.record("AjChargeOrderJob", 44)
      expect(record).to have_attributes(status: :completed, duplicates: a_value >= 1)
    end

    it "control, with the door switched off (IdempotentJob::ActiveJob.unprotected): both run" do
      IdempotentJob::ActiveJob.unprotected { race_processes }
      expect(Effects.count(44)).to eq(2)
      expect(IdempotentJob.record("AjChargeOrderJob", 44)).to be_nil
    end
  end
end
