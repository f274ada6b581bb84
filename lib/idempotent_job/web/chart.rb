# frozen_string_literal: true

require "erb"

module IdempotentJob
  class Web
    # A stacked bar chart of event times per series (repeats per cause), drawn on the
    # server as inline SVG: no script, no external asset. Each bar segment carries a
    # `<title>` (the browser shows it on hover) with its series, interval and count.
    class Chart
      # Series colours, in order (colour-blind-safe palette, Okabe–Ito).
      COLORS = %w[#0072B2 #E69F00 #009E73 #CC79A7 #56B4E9 #D55E00 #F0E442 #000000].freeze
      # Margins of the plot area, in pixels: left (y labels), bottom (x labels, legend), top.
      LEFT = 44
      BOTTOM = 38
      TOP = 12

      # @param series [Hash{String => Array<Time>}] event times per series name
      # @param from [Time] start of the period
      # @param to [Time] end of the period (after `from`)
      # @param buckets [Integer] bars
      # @param size [Array(Integer, Integer)] width and height in pixels (the SVG scales
      #   to its container's width)
      # @raise [ArgumentError] when `to` is not after `from` or buckets < 1
      def initialize(series:, from:, to:, buckets: 24, size: [760, 240])
        raise ArgumentError, "a chart needs to > from and at least one bucket" unless to > from && buckets >= 1

        @series = series.sort_by { |name, times| [-times.size, name] }.to_h
        @from = from
        @to = to
        @buckets = Integer(buckets)
        @width, @height = size
      end

      # @return [Array<Hash{String => Integer}>] per bucket, the count per series
      #   (times outside the period are left out)
      def counts
        span = (@to - @from) / @buckets
        table = Array.new(@buckets) { Hash.new(0) }
        @series.each do |name, times|
          times.each do |t|
            next if t < @from || t > @to

            table[[((t - @from) / span).floor, @buckets - 1].min][name] += 1
          end
        end
        table
      end

      # @return [String] the `<svg>` element
      def to_svg
        table = counts
        peak = table.map { |c| c.values.sum }.max.to_i
        [%(<svg class="ij-chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 #{@width} #{@height}" ) +
          %(width="100%" role="img" aria-label="#{esc(summary(peak))}">),
         axes(peak), bars(table, peak), legend, "</svg>"].join("\n")
      end

      private

      def plot_height = @height - BOTTOM - TOP
      def plot_width = @width - LEFT - 8
      def bar_width = plot_width.fdiv(@buckets)

      def summary(peak)
        total = @series.values.sum(&:size)
        "#{total} repeats from #{label(@from)} to #{label(@to)}, at most #{peak} in one interval"
      end

      def axes(peak)
        top = [peak, 1].max
        grid = [0, (top / 2.0).ceil, top].uniq.map do |v|
          y = y_of(v, top)
          %(<line x1="#{LEFT}" y1="#{y}" x2="#{@width - 8}" y2="#{y}" stroke="#d8dde3" stroke-width="1"/>) +
            %(<text x="#{LEFT - 6}" y="#{y + 4}" text-anchor="end" font-size="11" fill="#5b6570">#{v}</text>)
        end
        (grid + [0, @buckets / 2, @buckets].uniq.map { |i| tick(i) }).join("\n")
      end

      def tick(index)
        x = (LEFT + (index * bar_width)).round(1)
        anchor = { 0 => "start", @buckets => "end" }.fetch(index, "middle")
        %(<text x="#{x}" y="#{@height - BOTTOM + 16}" text-anchor="#{anchor}" font-size="11" ) +
          %(fill="#5b6570">#{esc(label(@from + ((@to - @from) * index / @buckets)))}</text>)
      end

      def bars(table, peak)
        top = [peak, 1].max
        table.each_with_index.flat_map do |count, i|
          below = 0
          @series.keys.each_with_index.filter_map do |name, s|
            next if count[name].zero?

            below += count[name]
            segment(i, s, name, count[name], [y_of(below - count[name], top), y_of(below, top)])
          end
        end.join("\n")
      end

      # One series' part of bar `index`, from y `bottom` up to `top`.
      def segment(index, series_index, name, count, (bottom, top))
        span = (@to - @from) / @buckets
        from = @from + (span * index)
        %(<rect x="#{(LEFT + (index * bar_width) + 1).round(1)}" y="#{top}" width="#{(bar_width - 2).round(1)}" ) +
          %(height="#{(bottom - top).round(1)}" fill="#{color(series_index)}"><title>#{esc(name)}: #{count} ) +
          %(#{count == 1 ? "repeat" : "repeats"}, #{esc(label(from))} – #{esc(label(from + span))}</title></rect>)
      end

      def legend
        x = LEFT
        @series.keys.each_with_index.map do |name, s|
          text = "#{name} (#{@series[name].size})"
          item = %(<rect x="#{x}" y="#{@height - 14}" width="10" height="10" fill="#{color(s)}"/>) +
                 %(<text x="#{x + 14}" y="#{@height - 5}" font-size="11" fill="#1f2933">#{esc(text)}</text>)
          x += 24 + (text.size * 6.2)
          item
        end.join("\n")
      end

      def y_of(value, top)
        (TOP + plot_height - (plot_height * value.fdiv(top))).round(1)
      end

      def color(index) = COLORS[index % COLORS.size]

      def label(time)
        format = @to - @from > 2 * 86_400 ? "%b %-d %H:%M" : "%H:%M"
        time.utc.strftime(format)
      end

      def esc(text) = ERB::Util.html_escape(text.to_s)
    end
  end
end
