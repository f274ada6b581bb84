# frozen_string_literal: true

require "json"
require "time"

module Soak
  # Reads the workers' Sidekiq logs (JSON lines, see boot.rb) and sorts every warning and
  # error into expected or not:
  # * the gem's decisions about stale claims (took over, held, given up) are expected;
  # * a delivery that failed with a connection-class error (IdempotentJob::ConnectionError,
  #   TimeoutError, or a DatabaseError of a connection PostgreSQL ended) is expected while
  #   PostgreSQL restarts and for {GRACE} seconds after, and so is the gem's error that a
  #   completion could not be recorded then;
  # * everything else at WARN, ERROR or FATAL, and any line that is not a log line, is
  #   unexpected.
  class LogScan
    # Seconds after a PostgreSQL restart during which connection errors are expected
    # (connect and checkout timeouts are 5 s each).
    GRACE = 15
    # Warnings of the gem that are decisions, not errors.
    DECISIONS = {
      "took over a stale claim to run it" => /took over the stale claim of .*running it again/,
      "took over a stale claim to hold it" => /is stale \(.*\): held for a person/,
      "took over a stale claim to give it up" => /is stale \(.*\): given up, not run/
    }.freeze
    # Errors a delivery may meet while PostgreSQL restarts.
    CONNECTION_ERRORS = /\A(IdempotentJob::(ConnectionError|TimeoutError|LockTimeoutError): |
                          IdempotentJob::DatabaseError: .*(terminating\ connection|shutting\ down|starting\ up|
                          connection))/x
    # Errors of the gem that are expected while PostgreSQL restarts.
    RESTART_ERRORS = /idempotent_job: .*(its completion could not be recorded|could not release the claim)/

    # A line that is not expected: file, line number, time and text.
    Finding = Struct.new(:file, :line, :at, :text, keyword_init: true) do
      # @return [String]
      def to_s
        "#{File.basename(file)}:#{line}: #{text[0, 300]}"
      end
    end

    # @return [Hash{String => Integer}] expected decisions and restart errors, by description
    attr_reader :expected
    # @return [Array<Finding>]
    attr_reader :unexpected

    # @param restarts [Array<Array(Float, Float)>] PostgreSQL restarts, epoch seconds
    def initialize(restarts)
      @restarts = restarts
      @expected = Hash.new(0)
      @unexpected = []
    end

    # Scans log files.
    # @param files [Array<String>]
    # @return [LogScan] self
    def scan(files)
      files.each do |file|
        failure_tids = {}
        File.foreach(file).with_index(1) { |text, number| line(file, number, text.chomp, failure_tids) }
      end
      self
    end

    private

    def line(file, number, text, failure_tids)
      return if text.strip.empty? || text.include?('"lvl":"INFO"') # most lines: skip them unparsed

      entry = parse(text)
      return note(file, number, nil, "not a log line: #{text}") unless entry
      return unless %w[WARN ERROR FATAL].include?(entry["lvl"])

      at = Time.iso8601(entry["ts"]).to_f
      message = entry["msg"].to_s
      tid = entry["tid"]
      if message.start_with?('{"context":"Job raised exception"')
        failure_tids[tid] = :error_line
      elsif failure_tids[tid] == :error_line
        failure_tids[tid] = :backtrace
        failure(file, number, at, message)
      elsif failure_tids.delete(tid) == :backtrace && message.include?(":in `")
        nil # the failure's backtrace
      else
        other(file, number, at, message)
      end
    end

    def parse(text)
      entry = JSON.parse(text)
      entry.is_a?(Hash) && entry["lvl"] && entry["ts"] ? entry : nil
    rescue JSON::ParserError
      nil
    end

    def failure(file, number, at, message)
      if CONNECTION_ERRORS.match?(message) && restarting?(at)
        @expected["delivery failed while PostgreSQL restarted (#{message.split(": ").first}), retried"] += 1
      else
        note(file, number, at, "delivery failed: #{message}")
      end
    end

    def other(file, number, at, message)
      decision = DECISIONS.find { |_, pattern| pattern.match?(message) }&.first
      if decision
        @expected[decision] += 1
      elsif RESTART_ERRORS.match?(message) && restarting?(at)
        @expected["while PostgreSQL restarted: #{message[RESTART_ERRORS, 1]}"] += 1
      else
        note(file, number, at, message)
      end
    end

    def restarting?(at)
      @restarts.any? { |from, to| at >= from - 1 && at <= to + GRACE }
    end

    def note(file, number, at, text)
      @unexpected << Finding.new(file:, line: number, at:, text:)
    end
  end
end
