
b	"p/job:localhost/replica:0/task:0/device:CPU:0;0000000000000000;/job:localhost/replica:0/task:0/device:CPU:0;c;0:0H